"""HandleGenerator: a generate whose replica died is sent again (same request, same seed), counted; a request whose
replicas keep dying fails with its id after ``max_retries``."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
import ray

from agents.records import GenerateRequest, GenerateResult, SamplingParams
from deployments.agent_workers import HandleGenerator

pytestmark = pytest.mark.unit


class FlakyHandle:
    """``handle.generate.remote(request)`` that dies ``deaths`` times, then answers; records each request."""

    def __init__(self, deaths: int):
        self.deaths, self.seen = deaths, []
        handle = self

        class Method:
            def remote(self, request):
                async def call():
                    handle.seen.append(request)
                    if len(handle.seen) <= handle.deaths:
                        raise ray.exceptions.ActorDiedError()
                    return GenerateResult((5, 6), (-0.1, -0.2), "stop", 0)
                return call()

        self.generate = Method()


def _request() -> GenerateRequest:
    return GenerateRequest(prompt_ids=(1, 2, 3), sampling=SamplingParams(seed=11), trajectory_id="t0", request_id="t0-1")


def test_a_dead_replica_is_retried_with_the_same_request():
    handle = FlakyHandle(deaths=2)
    generator = HandleGenerator(handle, max_retries=3)
    result = asyncio.run(generator.generate(_request()))
    assert result.token_ids == (5, 6) and generator.retries == 2
    assert len(handle.seen) == 3 and all(r == handle.seen[0] for r in handle.seen)  # same tokens, same seed


def test_replicas_that_keep_dying_fail_the_request_by_id():
    generator = HandleGenerator(FlakyHandle(deaths=10), max_retries=2)
    with pytest.raises(RuntimeError, match="'t0-1': its replica died 3 times"):
        asyncio.run(generator.generate(_request()))
    assert generator.retries == 2


# ---------------------------------------------------------------- the OpenAI ingress (its handler, without Serve)

def _ingress_generate(handle, requests):
    from deployments.openai_ingress import OpenAIIngress

    return asyncio.run(OpenAIIngress.func_or_class._generate(SimpleNamespace(rollout=handle), requests))


def test_the_ingress_sends_a_request_whose_replica_died_to_another_replica():
    handle = FlakyHandle(deaths=2)
    [result] = _ingress_generate(handle, [_request()])
    assert result.token_ids == (5, 6) and len(handle.seen) == 3 and all(r == handle.seen[0] for r in handle.seen)


def test_the_ingress_answers_503_in_openais_shape_naming_the_request_when_every_replica_dies():
    from fastapi import HTTPException

    from deployments.openai_ingress import _openai_error

    with pytest.raises(HTTPException) as info:
        _ingress_generate(FlakyHandle(deaths=10), [_request()])
    assert info.value.status_code == 503 and info.value.headers == {"Retry-After": "1"}
    assert "request t0-1: its replica died 4 times in a row (ActorDiedError); retry it" == info.value.detail
    response = asyncio.run(_openai_error(None, info.value))
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert json.loads(response.body) == {"error": {"message": info.value.detail, "type": "server_error", "param": None,
                                                   "code": 503}}


def test_replica_lost_survives_pickling_as_it_crosses_actor_boundaries():
    import pickle

    from deployments.replica_retry import ReplicaLost

    lost = pickle.loads(pickle.dumps(ReplicaLost("generate 't0-1': its replica died 4 times in a row", 4)))
    assert type(lost) is ReplicaLost and lost.attempts == 4 and str(lost).startswith("generate 't0-1'")
