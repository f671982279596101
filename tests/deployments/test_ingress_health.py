"""``GET /health`` of the OpenAI ingress: 503 in OpenAI's error shape until Serve runs a rollout replica of the app
(the ingress answers HTTP while the rollout replicas may still build their engines), 200 after; Serve's controller
is asked at most once a second per ingress replica."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException

from deployments import openai_ingress

pytestmark = pytest.mark.unit


def _status_of(*replica_states: dict[str, int] | None):
    """A stand-in for ``serve.status`` answering each given state in turn (None: the app is not deployed yet)."""
    answers, asked = iter(replica_states), []

    def status():
        states = next(answers)
        asked.append(states)
        apps = {} if states is None else {
            "app": SimpleNamespace(deployments={"RolloutServer": SimpleNamespace(replica_states=states)})}
        return SimpleNamespace(applications=apps)
    return status, asked


def _ingress(cache_s: float = 1.0):
    cls = openai_ingress.OpenAIIngress.func_or_class
    ingress = SimpleNamespace(rollout=SimpleNamespace(app_name="app", deployment_name="RolloutServer"),
                              _health=(float("-inf"), 0), health_cache_s=cache_s)
    ingress._running_rollout_replicas = lambda: cls._running_rollout_replicas(ingress)
    return lambda: asyncio.run(cls.health(ingress))


def test_health_is_a_503_until_a_rollout_replica_runs_then_names_how_many(monkeypatch):
    status, asked = _status_of(None, {"STARTING": 2}, {"RUNNING": 1, "STARTING": 1})
    monkeypatch.setattr(openai_ingress.serve, "status", status)
    health = _ingress(cache_s=0.0)
    for _ in range(2):
        with pytest.raises(HTTPException) as info:
            health()
        assert info.value.status_code == 503 and info.value.headers == {"Retry-After": "2"}
        assert "no replica of RolloutServer is running yet" in info.value.detail
    response = asyncio.run(openai_ingress._openai_error(None, info.value))
    assert json.loads(response.body)["error"]["type"] == "server_error" and response.status_code == 503
    assert health() == {"status": "ok", "rollout_replicas": 1}
    assert len(asked) == 3


def test_health_asks_serve_at_most_once_a_second(monkeypatch):
    status, asked = _status_of({"RUNNING": 2}, {"RUNNING": 0})
    monkeypatch.setattr(openai_ingress.serve, "status", status)
    health = _ingress()
    assert [health() for _ in range(5)] == [{"status": "ok", "rollout_replicas": 2}] * 5
    assert len(asked) == 1



def test_a_controller_that_does_not_answer_is_a_503_not_a_500(monkeypatch):
    def status():
        raise TimeoutError("controller restarting")
    monkeypatch.setattr(openai_ingress.serve, "status", status)
    with pytest.raises(HTTPException) as info:
        _ingress()()
    assert info.value.status_code == 503
