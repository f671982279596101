"""HandleGenerator: a generate whose replica died is sent again (same request, same seed), counted; a request whose
replicas keep dying fails with its id after ``max_retries``."""

from __future__ import annotations

import asyncio

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
