"""The app's adapter registry on a local Ray cluster: dropped with its app, so the next app starts at version 0."""

from __future__ import annotations

import time
from dataclasses import replace

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


def test_a_run_can_start_from_a_saved_adapter_as_version_0(ray_cluster, tiny_model_dir, adapter_paths):
    """``reset(base=AdapterRef(0, path))``: replicas (also one that starts later) sample with that adapter at
    version 0, the run's first publish (v1) is accepted, and a plain reset takes them back to the base model."""
    import asyncio

    from agents.records import GenerateRequest, SamplingParams
    from deployments.adapter_registry import AdapterRegistry
    from deployments.engines.hf_engine import HFEngine
    from deployments.rollout_server import RolloutServer

    registry = AdapterRegistry.options(name="start-adapter-test", namespace="tandem-tests").remote()
    start = AdapterRef(0, str(adapter_paths[1]))
    request = GenerateRequest((5, 6, 7), SamplingParams(temperature=0.0, max_new_tokens=8))

    def server(i: int) -> RolloutServer:
        return RolloutServer(HFEngine(str(tiny_model_dir), max_model_len=64), replica_id=f"r{i}")

    async def scenario():
        servers = [server(0)]
        await servers[0].follow(registry, poll_s=0.5)
        base = await servers[0].generate(request)
        with pytest.raises(ValueError, match="a run starts at version 0"):
            await registry.reset.remote(5.0, AdapterRef(1, str(adapter_paths[1])))
        reset = await registry.reset.remote(30.0, start)
        servers.append(server(1))  # started after the reset (autoscaling): loads the start adapter first
        await servers[1].follow(registry, poll_s=0.5)
        started = [await s.generate(request) for s in servers]
        paths = [s.adapter_path for s in servers]
        first_publish = await registry.publish.remote(AdapterRef(1, str(adapter_paths[2])), 30.0)
        v1 = await servers[1].generate(request)
        back = await registry.reset.remote(30.0)
        after = [await s.generate(request) for s in servers]
        for s in servers:
            await s.close(registry)
        return base, reset, started, paths, first_publish, v1, back, after

    base, reset, started, paths, first_publish, v1, back, after = asyncio.run(scenario())
    reference = asyncio.run(_generate_with(tiny_model_dir, AdapterRef(1, str(adapter_paths[1])), request))
    ray.kill(registry)
    assert reset == {"r0": 0}
    assert paths == [start.path] * 2
    assert [(r.policy_version, r.token_ids) for r in started] == [(0, reference.token_ids)] * 2
    assert started[0].token_ids != base.token_ids
    assert first_publish == {"r0": 1, "r1": 1}
    assert v1.policy_version == 1 and v1.token_ids not in (base.token_ids, reference.token_ids)
    assert back == {"r0": 0, "r1": 0}
    assert [(r.policy_version, r.token_ids) for r in after] == [(0, base.token_ids)] * 2


async def _generate_with(model_dir, ref: AdapterRef, request):
    """What an engine that loaded ``ref`` as a published version samples for ``request``."""
    from deployments.engines.hf_engine import HFEngine

    engine = HFEngine(str(model_dir), max_model_len=64)
    try:
        await engine.load_adapter(ref)
        return await engine.generate(request.prompt_ids, request.sampling, "reference")
    finally:
        await engine.close()


def test_an_adapter_a_replica_cannot_load_fails_the_publish_with_the_cause(ray_cluster, tiny_model_dir, tmp_path):
    """Not a 120 s timeout without a reason: the replica reports the load error and the publish raises it."""
    import asyncio
    import time

    from deployments.adapter_registry import AdapterRegistry
    from deployments.engines.hf_engine import HFEngine
    from deployments.rollout_server import RolloutServer

    bad = tmp_path / "not-an-adapter"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{}")
    registry = AdapterRegistry.options(name="load-fail-test", namespace="tandem-tests").remote()

    async def scenario():
        server = RolloutServer(HFEngine(str(tiny_model_dir), max_model_len=64), replica_id="r0")
        await server.follow(registry, poll_s=0.5)
        start = time.monotonic()
        try:
            await registry.publish.remote(AdapterRef(1, str(bad)), 60.0)
        except Exception as exc:  # noqa: BLE001 (the RayTaskError carries the registry's RuntimeError)
            return exc, time.monotonic() - start, server.policy_version
        finally:
            await server.close(registry)
        return None, time.monotonic() - start, server.policy_version

    error, seconds, version = asyncio.run(scenario())
    ray.kill(registry)
    assert error is not None and version == 0
    assert "adapter version 1 ('" in str(error) and "failed to load on replica(s) ['r0']" in str(error), str(error)
    assert seconds < 30, seconds


def test_a_replica_that_cannot_read_the_adapter_path_loads_it_from_the_object_store(ray_cluster, tiny_model_dir,
                                                                                      adapter_paths):
    """A cluster without a shared filesystem: the trainer's folder exists only on its node; the replica loads the
    files the trainer put in the object store and samples exactly as from the folder itself."""
    import asyncio

    from agents.records import GenerateRequest, SamplingParams
    from deployments.adapter_registry import AdapterRegistry
    from deployments.engines.hf_engine import HFEngine
    from deployments.rollout_server import RolloutServer
    from trainers.publisher import shareable

    registry = AdapterRegistry.options(name="files-test", namespace="tandem-tests").remote()
    request = GenerateRequest((5, 6, 7), SamplingParams(temperature=0.0, max_new_tokens=8))
    elsewhere = "/nonexistent/trainer-node/run/adapters/v2"  # what the trainer's node wrote

    async def scenario():
        server = RolloutServer(HFEngine(str(tiny_model_dir), max_model_len=64), replica_id="r0")
        await server.follow(registry, poll_s=0.5)
        await registry.publish.remote(AdapterRef(1, str(adapter_paths[1])), 30.0)
        by_path = await server.generate(request)
        loaded = await registry.publish.remote(replace(shareable(AdapterRef(2, str(adapter_paths[1]))),
                                                       path=elsewhere), 30.0)
        from_store = await server.generate(request)
        # the folder exists here, but another node wrote it: only the writer's node reads the folder
        other_node = replace(shareable(AdapterRef(3, str(adapter_paths[1]))), node_id="f" * 56)
        await registry.publish.remote(other_node, 30.0)
        from_other_node = await server.generate(request)
        copies = sorted(p.name for p in server._adapter_dir.iterdir())
        await server.close(registry)
        return by_path, loaded, from_store, from_other_node, copies, server.adapter_path, server.replica_stats()

    by_path, loaded, from_store, from_other_node, copies, path, stats = asyncio.run(scenario())
    ray.kill(registry)
    assert loaded == {"r0": 2}  # the registry sees the published ref, not the local copy
    assert (from_store.policy_version, from_store.token_ids) == (2, by_path.token_ids)
    assert (from_other_node.policy_version, from_other_node.token_ids) == (3, by_path.token_ids)
    assert path == str(adapter_paths[1])
    assert sorted(c[:3] for c in copies) == ["v2-", "v3-"]
    assert stats["adapter_loads"] == {"path": 1, "object_store": 2}
    assert stats["node_id"] == ray.get_runtime_context().get_node_id()


def test_the_newest_adapters_copy_outlives_the_learner_that_put_it(ray_cluster, tmp_path):
    """A learner's worker owns the objects it puts: when it dies (a restart, the end of the run) they are lost. The
    registry keeps its own copy of the newest adapter's files, so replicas that join later still load it."""
    folder = tmp_path / "v1"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB, as adapters are MBs

    @ray.remote(num_cpus=0)
    class Learner:
        def publish(self, path: str, app: str) -> AdapterRef:
            from trainers.publisher import shareable

            ref = shareable(AdapterRef(1, path))
            ray.get(get_adapter_registry(app).publish.remote(ref, 1.0))  # no replica: returns at once
            return ref

    learner = Learner.remote()
    ref = ray.get(learner.publish.remote(str(folder), "owner-test"))
    ray.kill(learner)

    def learners_copy_lost() -> bool:  # the raylet frees a dead owner's objects within about a second
        try:
            ray.get(ref.files, timeout=10)
        except ray.exceptions.OwnerDiedError:
            return True
        return False

    deadline = time.monotonic() + 30
    while not learners_copy_lost():
        assert time.monotonic() < deadline, "the dead learner's object was never freed"
        time.sleep(0.5)
    latest = ray.get(get_adapter_registry("owner-test").latest.remote())
    assert latest == AdapterRef(1, str(folder)) and ray.get(latest.files, timeout=30) == {
        "adapter_config.json": b'{"r": 8}', "adapter_model.safetensors": bytes(range(256)) * 4096}
    assert drop_adapter_registry("owner-test") is True
