"""A run that starts from a saved LoRA adapter: ``attach_rollout_app`` / ``deploy_rollout_app`` with a
version-0 ``base`` ref that has a path return with every replica sampling with that adapter."""

from __future__ import annotations

import asyncio
import warnings

import pytest
import ray

from agents.records import AdapterRef, GenerateRequest, SamplingParams

pytestmark = pytest.mark.integration

REQUEST = GenerateRequest((5, 6, 7), SamplingParams(temperature=0.0, max_new_tokens=8))


def _reference(model_dir, ref: AdapterRef) -> tuple[int, ...]:
    """Greedy tokens of ``REQUEST`` from an engine that loaded ``ref``."""
    from deployments.engines.hf_engine import HFEngine

    async def body():
        engine = HFEngine(str(model_dir), max_model_len=64)
        try:
            await engine.load_adapter(ref)
            return (await engine.generate(REQUEST.prompt_ids, REQUEST.sampling, "reference")).token_ids
        finally:
            await engine.close()

    return asyncio.run(body())


def _generate_on_every_replica(handle, replicas: int = 2) -> set[tuple[int, tuple[int, ...], str]]:
    """(policy_version, token_ids, replica_id) of one greedy generate per trajectory, spread over replicas."""
    results = [handle.generate.remote(GenerateRequest(REQUEST.prompt_ids, REQUEST.sampling, trajectory_id=f"s{i}"))
               for i in range(8 * replicas)]
    return {(r.policy_version, r.token_ids, r.replica_id) for r in (x.result() for x in results)}


def test_attach_with_a_start_adapter_and_back_to_the_base_model(rollout_app, adapter_paths):
    from deployments.rollout_app import attach_rollout_app, publish_adapter
    from deployments.adapter_registry import get_adapter_registry

    previous = ray.get(get_adapter_registry(rollout_app.name).latest.remote())
    start = AdapterRef(0, str(adapter_paths[1]))
    tuned = _reference(rollout_app.model_dir, AdapterRef(1, str(adapter_paths[1])))
    base = _reference(rollout_app.model_dir, AdapterRef(0))
    try:
        attach_rollout_app(rollout_app.name, wait_s=120, base=start)
        with_start = _generate_on_every_replica(rollout_app.handle)
        attach_rollout_app(rollout_app.name, wait_s=120)
        with_base = _generate_on_every_replica(rollout_app.handle)
    finally:
        if previous.version:  # other tests of the session share the app
            publish_adapter(rollout_app.name, previous, wait_s=120)
    assert {(v, t) for v, t, _ in with_start} == {(0, tuned)}
    assert {(v, t) for v, t, _ in with_base} == {(0, base)} and base != tuned


@pytest.mark.slow
def test_deploy_with_a_start_adapter(rollout_app, tiny_model_dir, adapter_paths):
    from ray import serve

    from deployments.rollout_app import delete_rollout_app, deploy_rollout_app
    from configs import ConfigWarning, load_config
    from deployments.adapter_registry import get_adapter_registry

    port = int(rollout_app.base_url.split(":")[-1].split("/")[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = load_config(None, [
            f"actor_rollout_ref.model.path={tiny_model_dir}", "serve.app_name=start-adapter-app",
            "serve.route_prefix=/start", f"serve.port={port}", "serve.num_cpus_per_replica=0.5",
            "actor_rollout_ref.rollout.max_num_seqs=8",
        ])
    start = AdapterRef(0, str(adapter_paths[2]))
    tuned = _reference(tiny_model_dir, AdapterRef(1, str(adapter_paths[2])))
    handle = deploy_rollout_app(cfg, base=start)
    try:
        results = _generate_on_every_replica(handle, replicas=1)
        registry = get_adapter_registry("start-adapter-app")
        assert ray.get(registry.latest.remote()) == start
        # the run's first publish is version 1
        assert ray.get(registry.publish.remote(AdapterRef(1, str(adapter_paths[1])), 60.0)) != {}
    finally:
        delete_rollout_app("start-adapter-app")
    assert {(v, t) for v, t, _ in results} == {(0, tuned)}
    assert "start-adapter-app" not in serve.status().applications
