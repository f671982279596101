"""Sticky least-loaded routing on the shared 2-replica app, and a sticky replica that dies."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray
from transformers import AutoTokenizer

from agents.records import GenerateRequest, SamplingParams
from benchmarks.routing import measure_routing
from deployments.adapter_registry import get_adapter_registry
from deployments.replica_retry import call_surviving_deaths

pytestmark = pytest.mark.integration

SHORT = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0)


def _prompt(model_dir) -> tuple[int, ...]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": "Route me somewhere."}]
    return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def _generate(app, prompt, trajectory_id):
    return app.handle.generate.remote(GenerateRequest(prompt, SHORT, trajectory_id=trajectory_id)).result()


def _generate_surviving(app, prompt, trajectory_id, retries: list[int]):
    """As tandem-rl's callers send (``call_surviving_deaths``): Serve's handle may still send a first try to a replica
    that died before its router heard of the death; that try fails and is sent again."""
    async def call():
        return await app.handle.generate.remote(GenerateRequest(prompt, SHORT, trajectory_id=trajectory_id))

    return asyncio.run(call_surviving_deaths(call, f"trajectory {trajectory_id}", on_retry=lambda: retries.append(1)))


def test_turns_of_64_concurrent_trajectories_stick_to_one_replica(rollout_app):
    stats = asyncio.run(
        measure_routing(rollout_app.handle, _prompt(rollout_app.model_dir), num_replicas=2, trajectories=64,
                        turns=3, max_new_tokens=4, tag="sticky-test")
    )
    assert stats["requests"] == 64 * 3
    assert stats["sticky_share"] >= 0.99
    # New trajectories went to the replica with fewer in flight: the 64 split evenly, not all on one.
    assert stats["trajectory_split_ratio"] <= 1.5


@pytest.mark.slow
def test_request_goes_elsewhere_when_its_sticky_replica_dies(rollout_app):
    prompt = _prompt(rollout_app.model_dir)
    first = _generate(rollout_app, prompt, "doomed")
    stats = rollout_app.handle.replica_stats.remote(trajectory_id="doomed").result()
    assert stats["replica_id"] == first.replica_id
    ray.kill(ray.get_actor(stats["actor_name"], namespace="serve"), no_restart=True)

    retries: list[int] = []
    second = _generate_surviving(rollout_app, prompt + first.token_ids, "doomed", retries)
    third = _generate_surviving(rollout_app, prompt + first.token_ids + second.token_ids, "doomed", retries)
    assert second.replica_id != first.replica_id and len(retries) <= 1  # at most the try that reached the dead one
    assert third.replica_id == second.replica_id  # re-stuck to the new replica

    # Serve replaces the dead replica; the replacement loads the newest adapter before it serves.
    newest = ray.get(get_adapter_registry(rollout_app.name).latest.remote()).version
    deadline = time.monotonic() + 180
    attempt = 0
    while True:
        assert time.monotonic() < deadline, "no request reached a replacement replica within 180 s"
        attempt += 1
        result = _generate(rollout_app, prompt, f"probe-{attempt}")
        if result.replica_id not in (first.replica_id, second.replica_id):
            break
        time.sleep(0.5)
    assert result.policy_version == newest
