"""The app's adapter registry on a local Ray cluster: dropped with its app, so the next app starts at version 0."""

from __future__ import annotations

import pytest
import ray

from agents.records import AdapterRef
from deployments.adapter_registry import drop_adapter_registry, get_adapter_registry

pytestmark = pytest.mark.integration


def test_a_dropped_registry_comes_back_at_policy_version_0(ray_cluster, adapter_paths):
    app = "registry-drop-test"
    registry = get_adapter_registry(app)
    # No replica is live: the publish returns at once with nobody to wait for.
    assert ray.get(registry.publish.remote(AdapterRef(3, str(adapter_paths[1])), 5.0)) == {}
    assert ray.get(get_adapter_registry(app).latest.remote()).version == 3  # same detached actor

    assert drop_adapter_registry(app) is True
    fresh = get_adapter_registry(app)
    assert ray.get(fresh.latest.remote()) == AdapterRef(0)
    assert ray.get(fresh.publish.remote(AdapterRef(1, str(adapter_paths[1])), 5.0)) == {}  # version 1 is newer again
    assert drop_adapter_registry(app) is True
    assert drop_adapter_registry(app) is False  # nothing left to drop


def test_reset_takes_following_replicas_back_to_the_base_model_for_a_new_run(ray_cluster, tiny_model_dir,
                                                                            adapter_paths):
    """An app deployed once (``serve deploy``) serves run after run: each run starts from a reset."""
    import asyncio

    from agents.records import GenerateRequest, SamplingParams
    from deployments.adapter_registry import AdapterRegistry
    from deployments.engines.hf_engine import HFEngine
    from deployments.rollout_server import RolloutServer

    registry = AdapterRegistry.options(name="reset-test", namespace="tandem-tests").remote()
    request = GenerateRequest((5, 6, 7), SamplingParams(temperature=0.0, max_new_tokens=8))

    async def scenario():
        servers = [RolloutServer(HFEngine(str(tiny_model_dir), max_model_len=64), replica_id=f"r{i}") for i in range(2)]
        for server in servers:
            await server.follow(registry, poll_s=0.5)
        base = await servers[0].generate(request)
        first_run = [await registry.publish.remote(AdapterRef(v, str(adapter_paths[v])), 30.0) for v in (1, 2)]
        tuned = await servers[1].generate(request)
        reset = await registry.reset.remote(30.0)  # the next run starts
        after_reset = [await server.generate(request) for server in servers]
        second_run = await registry.publish.remote(AdapterRef(1, str(adapter_paths[1])), 30.0)
        again = await servers[0].generate(request)
        for server in servers:
            await server.close(registry)
        return base, first_run, tuned, reset, after_reset, second_run, again

    base, first_run, tuned, reset, after_reset, second_run, again = asyncio.run(scenario())
    ray.kill(registry)
    assert first_run == [{"r0": 1, "r1": 1}, {"r0": 2, "r1": 2}]
    assert tuned.policy_version == 2 and tuned.token_ids != base.token_ids
    assert reset == {"r0": 0, "r1": 0}
    assert [(r.policy_version, r.token_ids) for r in after_reset] == [(0, base.token_ids)] * 2
    assert second_run == {"r0": 1, "r1": 1}  # version 1 is newer than the reset's 0: accepted
    assert again.policy_version == 1
