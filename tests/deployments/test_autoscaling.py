"""Autoscaling during training: when the queue grows Serve adds ``RolloutServer`` replicas, and each one
it adds samples with the adapter published before it started, never the base model.

A separate app on the session cluster (one replica, room for a second) with a fast autoscaling config:
queue lengths reported every 0.5 s, averaged over 2 s, target one request per replica, no upscale delay.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from ray import serve
from transformers import AutoTokenizer

from agents.records import AdapterRef, GenerateRequest, GenerateResult, SamplingParams
from orchestration.publishing import AdapterPublisher, MetricsSink
from deployments.rollout_app import (ROLLOUT_DEPLOYMENT, RolloutAppArgs, build_app, delete_rollout_app, publish_adapter,
                          rollout_handle)
from deployments.adapter_registry import get_adapter_registry
from tests.deployments.conftest import MAX_MODEL_LEN, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tandem-autoscale-test"
FAST_AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 1,
    "max_ongoing_requests": 4,
    "upscale_delay_s": 0.0,
    "downscale_delay_s": 600.0,  # no scale-down while the test looks
    "metrics_interval_s": 0.5,
    "look_back_period_s": 2.0,
}
IN_FLIGHT = 16  # generates kept queued: 16x the target of one per replica
SERVED_BY_NEW = 8  # generates the added replica must answer before the flood stops
DEADLINE_S = 240.0  # the shared 2-core box is slow to start a replica; no timing is asserted beyond this
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=64)


@pytest.fixture
def autoscaling_app(ray_cluster, tiny_model_dir):
    """The rollout app with min_replicas=1 < max_replicas=2; deleted (with its adapter registry) afterwards."""
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    args = RolloutAppArgs(
        model=str(tiny_model_dir),
        max_model_len=MAX_MODEL_LEN,
        num_cpus=0.5,
        engine_kwargs={"max_batch_size": 4},
        **FAST_AUTOSCALING,
    )
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    try:
        yield rollout_handle(APP)
    finally:
        delete_rollout_app(APP)  # the app and its (detached) adapter registry


def _running_replicas() -> int:
    deployment = serve.status().applications[APP].deployments[ROLLOUT_DEPLOYMENT]
    return sum(count for state, count in deployment.replica_states.items() if state == "RUNNING")


async def _flood(handle, prompt: tuple[int, ...], before: set[str]) -> tuple[list[GenerateResult], int]:
    """Keep ``IN_FLIGHT`` generates queued until replicas not in ``before`` answered ``SERVED_BY_NEW``.

    Returns every result and the most RUNNING replicas seen meanwhile.
    """
    deadline = time.monotonic() + DEADLINE_S
    results: list[GenerateResult] = []
    pending: set[asyncio.Future] = set()
    most_running, sent = _running_replicas(), 0
    while sum(r.replica_id not in before for r in results) < SERVED_BY_NEW:
        assert time.monotonic() < deadline, (
            f"within {DEADLINE_S}s no added replica answered {SERVED_BY_NEW} generates "
            f"(most RUNNING replicas seen: {most_running}; answers by replica: "
            f"{ {rid: sum(r.replica_id == rid for r in results) for rid in {r.replica_id for r in results}} })"
        )
        while len(pending) < IN_FLIGHT:
            # A fresh trajectory id each time: the sticky router sends it to the least-loaded replica.
            request = GenerateRequest(prompt, SAMPLING, trajectory_id=f"flood-{sent}")
            pending.add(asyncio.ensure_future(handle.generate.remote(request)))
            sent += 1
        done, pending = await asyncio.wait(pending, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        results.extend(future.result() for future in done)
        most_running = max(most_running, _running_replicas())
    results.extend(await asyncio.gather(*pending))
    return results, most_running


class _Local:
    """An in-process object called the way an actor handle is (``obj.method.remote(...)``, then ``ray.get``)."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        method = getattr(self._obj, name)
        return type("M", (), {"remote": staticmethod(lambda *a, **k: ray.put(method(*a, **k)))})


def test_queue_growth_adds_replicas_that_sample_the_published_adapter(autoscaling_app, tiny_model_dir,
                                                                      adapter_paths):
    loaded = publish_adapter(APP, AdapterRef(1, str(adapter_paths[1])), wait_s=120)
    assert len(loaded) == 1 and set(loaded.values()) == {1}, loaded
    before = set(loaded)
    sink = MetricsSink()
    publisher = AdapterPublisher(APP, coordinator=None, sink=_Local(sink))  # only its replica reporting is used
    publisher.report_joined()
    switches = sink.take().switches
    assert [s["replicas"] for s in switches] == [loaded]
    assert _running_replicas() == 1

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tuple(tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a long story."}],
                                                 add_generation_prompt=True, return_dict=False))
    results, most_running = asyncio.run(_flood(autoscaling_app, prompt, before))

    assert most_running == FAST_AUTOSCALING["max_replicas"] > FAST_AUTOSCALING["min_replicas"]
    added = {r.replica_id for r in results} - before
    assert added, "every generate was answered by the replica that existed before the flood"
    versions = {(r.replica_id, r.policy_version) for r in results if r.replica_id in added}
    assert {version for _, version in versions} == {1}, f"an added replica sampled another policy: {versions}"
    assert all(r.policy_version == 1 for r in results)
    live = ray.get(get_adapter_registry(APP).live_replicas.remote())
    assert {replica: live.get(replica) for replica in added} == dict.fromkeys(added, 1)
    # The training driver logs the added replica once, with the version it loaded.
    publisher.report_joined()
    publisher.report_joined()
    switches = sink.take().switches
    joined = {replica: version for s in switches if s["joined"] for replica, version in s["replicas"].items()}
    assert joined == dict.fromkeys(added, 1)
