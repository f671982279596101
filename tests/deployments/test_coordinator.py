"""The coordinator against real agent workers and a real rollout app (partial rollouts: the engine swaps adapters
between decode steps). By default a group that spans a weight sync finishes, reaches the learner's batch and
carries the version of every token; with ``abort_stale`` a publish aborts the groups that started too long ago,
counted once and cancelled. Either way the accounting balances, each bucket counted on its own side."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "coordinator-test"


def _wait_for(predicate, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture(scope="module")
def interrupt_app(ray_cluster, tiny_model_dir):
    """One replica whose engine swaps adapters between decode steps (``stream.partial_rollout``)."""
    from ray import serve

    from deployments.rollout_app import RolloutAppArgs, build_app, rollout_handle

    args = RolloutAppArgs(model=str(tiny_model_dir), parser="qwen25_coder", max_model_len=512, min_replicas=1,
                          max_replicas=1, num_cpus=0.5, engine_kwargs={"max_batch_size": 8, "swap": "interrupt"})
    serve.run(build_app(args), name=APP, route_prefix="/coordinator-test")
    yield rollout_handle(APP)
    serve.delete(APP)


def _setup(handle, model_dir, run_id: str, *, abort_stale: bool, groups: int = 2):
    import ray

    from agents.data.rows import DatasetRow
    from orchestration.coordinator import CoordinatorActor
    from configs import load_config
    from deployments.agent_workers import AgentWorker, AgentWorkerSpec
    from trainers.admission import AdmissionController
    from trainers.buffer import TrajectoryBuffer

    # the random tiny model rarely samples EOS: every episode runs to its 300-token budget
    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        "data.max_prompt_length=64", "data.max_response_length=300", f"data.train_batch_size={groups}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={groups}",
    ])
    spec = AgentWorkerSpec.from_config(cfg)
    buffer = ray.remote(num_cpus=0)(TrajectoryBuffer).remote(batch_groups=groups, max_staleness=0,
                                                             drop_stale=abort_stale)
    worker = AgentWorker.remote(spec, handle, buffer, run_id=run_id)
    rows = [DatasetRow.model_validate({
        "data_source": "tandem/arithmetic", "ability": "math",
        "prompt": [{"role": "user", "content": f"Count to {i}."}], "reward_model": {"ground_truth": "0"},
        "extra_info": {"index": i, "question": f"Count to {i}.", "answer": "0"}}) for i in range(4)]
    admission = AdmissionController(groups, 0, abort_stale=abort_stale)
    coordinator = CoordinatorActor.remote(rows, [worker], buffer, admission, seed=0, run_id=run_id)
    ray.get(buffer.set_drop_listener.remote(coordinator))
    return buffer, coordinator, coordinator.run.remote()


def _publish(adapter, version: int) -> None:
    import ray

    from agents.records import AdapterRef
    from deployments.adapter_registry import get_adapter_registry

    from deployments.rollout_app import publish_adapter

    registry = get_adapter_registry(APP)
    assert ray.get(registry.latest.remote()).version == version - 1
    publish_adapter(APP, AdapterRef(version, str(adapter)), wait_s=120)


def _accounting(done, buffer):
    import ray

    from orchestration.coordinator import accounting

    return accounting(ray.get(done, timeout=60), ray.get(buffer.stats.remote()))


def test_a_group_spanning_a_weight_sync_is_trained_with_per_token_versions(interrupt_app, tiny_model_dir,
                                                                           tmp_path_factory):
    import ray

    from tests.deployments.engines.tiny_assets import build_random_adapter

    adapter = build_random_adapter(tiny_model_dir, tmp_path_factory.mktemp("coord") / "v1", seed=7)
    buffer, coordinator, done = _setup(interrupt_app, tiny_model_dir, "spans", abort_stale=False)
    try:
        _wait_for(lambda: interrupt_app.replica_stats.remote().result()["in_flight"] == 4, "4 generates running")
        time.sleep(0.3)  # some tokens sampled with version 0
        _publish(adapter, 1)
        assert ray.get(coordinator.on_publish.remote(1)) == 0  # nothing aborted: admitted groups always finish
        batch = ray.get(buffer.next_batch.remote(2), timeout=300)  # step 2 trains version 1: staleness 1 > 0
        metrics = ray.get(buffer.pop_step_metrics.remote(2))
    finally:
        ray.get(coordinator.stop.remote())
        ray.get(buffer.close.remote())
    book = _accounting(done, buffer)
    assert {t.group_id for t in batch} and len(batch) == 4  # both first groups, neither dropped
    spanning = [t for t in batch if set(t.token_versions) >= {0, 1}]
    assert spanning, [(t.group_id, t.policy_version, len(t.response_ids), sorted(set(t.token_versions))) for t in batch]
    for t in spanning:  # versions never go back within a response, and the trajectory is as old as its oldest token
        versions = [v for v in t.token_versions if v >= 0]
        assert versions == sorted(versions) and t.policy_version == 0
        assert len(t.rollout_logprobs) == len(t.token_versions) == len(t.response_ids)
    assert 0 < metrics["staleness/older_token_share"] < 1 and metrics["staleness/max"] == 1
    assert book["groups/aborted_in_flight"] == 0 and book["groups/dropped_stale"] == 0
    assert book["groups/balanced"] == 1 and book["groups/trained"] == 2


def test_abort_stale_aborts_groups_that_started_too_long_ago(interrupt_app, tiny_model_dir):
    import ray

    buffer, coordinator, done = _setup(interrupt_app, tiny_model_dir, "abort", abort_stale=True)
    try:
        _wait_for(lambda: ray.get(coordinator.stats.remote())["groups/in_flight"] == 2, "two groups in flight")
        # the learner moved on twice (no adapter needed: admission only hears the version)
        assert ray.get(coordinator.on_publish.remote(1)) == 2  # started at 0 < 1 − 0
        # the freed slots refill up to the bound at version 1: (0 + 1 + 1) × 2 groups, none of them aborted
        stats = _wait_for(lambda: (s := ray.get(coordinator.stats.remote()))["groups/admitted"] == 6 and s,
                          "four replacement groups admitted")
    finally:
        ray.get(coordinator.stop.remote())
        ray.get(buffer.close.remote())
    assert stats["groups/aborted_in_flight"] == 2 and stats["groups/failed"] == 0  # a cancel is not a failure
    book = _accounting(done, buffer)
    assert book["groups/aborted_in_flight"] == 2
    assert book["groups/balanced"] == 1, book

