"""The coordinator against real agent workers and the shared rollout app: a group still generating when the
learner moves past what it could be trained with is abandoned, counted once, and cancelled."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _wait_for(predicate, what: str, timeout_s: float = 120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_groups_that_can_no_longer_be_fresh_are_abandoned_and_counted(rollout_app) -> None:
    import ray

    from apps.coordinator import CoordinatorActor
    from apps.rollout import publish_adapter
    from configs import load_config
    from deployments.adapter_registry import get_adapter_registry
    from deployments.agent_workers import AgentWorker, AgentWorkerSpec
    from trainers.buffer import TrajectoryBuffer

    # Episodes must outlast the version bump: sample with the base model, not an adapter an earlier test of
    # the session published (the tool-call adapter ends every episode after a few tokens); restored below.
    registry = get_adapter_registry(rollout_app.name)
    previous = ray.get(registry.latest.remote())
    ray.get(registry.reset.remote(120.0))

    # the random tiny model rarely samples EOS: every episode runs to its 400-token budget
    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={rollout_app.model_dir}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        "data.max_prompt_length=64", "data.max_response_length=400", "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    ])
    spec = AgentWorkerSpec.from_config(cfg)
    buffer = ray.remote(num_cpus=0)(TrajectoryBuffer).remote(batch_groups=2, max_staleness=0, capacity_groups=8)
    worker = AgentWorker.remote(spec, rollout_app.handle, buffer, run_id="abandon")
    rows = [{"data_source": "tandem/arithmetic", "prompt": [{"role": "user", "content": f"Count to {i}."}],
             "reward_model": {"ground_truth": "0"}, "extra_info": {"index": i}} for i in range(4)]
    coordinator = CoordinatorActor.remote(rows, [worker], buffer, seed=0, run_id="abandon")
    done = coordinator.run.remote()
    try:
        _wait_for(lambda: ray.get(buffer.stats.remote())["buffer/in_flight"] == 2, "two groups in flight")
        ray.get(buffer.set_version.remote(1))  # the learner moved on: groups started at version 0 are doomed
        stats = _wait_for(lambda: (s := ray.get(buffer.stats.remote()))["groups/aborted_in_flight"] >= 1 and s,
                          "an abandoned group")
    finally:
        ray.get(coordinator.stop.remote())
        final = ray.get(done, timeout=60)
        ray.get(buffer.close.remote())
        if previous.version:
            publish_adapter(rollout_app.name, previous, wait_s=120)
    stats = ray.get(buffer.stats.remote())
    assert stats["groups/aborted_in_flight"] >= 1
    assert stats["groups/dropped_stale"] >= stats["groups/aborted_in_flight"]
    assert final["rollout/groups_abandoned"] == stats["groups/aborted_in_flight"]
    assert stats["groups/failed"] == 0 and final["rollout/groups_failed"] == 0  # a cancel is not a failure
    assert stats["groups/admitted"] == (stats["groups/trained"] + stats["groups/dropped_stale"]
                                        + stats["groups/failed"] + stats["groups/left_over"])
