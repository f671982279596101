"""TrajectoryBuffer: a bounded queue in completion order; stale groups trained by default, dropped and counted with
drop_stale; the long-share and length metrics that show a short-episode bias."""

import asyncio

import pytest

from agents.records import Trajectory
from trainers.buffer import TrajectoryBuffer

pytestmark = pytest.mark.unit


def group(gid: str, version: int, n: int = 2, length: int = 1) -> list[Trajectory]:
    return [
        Trajectory(trajectory_id=f"{gid}-{i}", group_id=gid, prompt_ids=(1, 2), response_ids=(3,) * length,
                   response_mask=(1,) * length, rollout_logprobs=(-0.5,) * length, reward=float(i),
                   policy_version=version)
        for i in range(n)
    ]


def run(coro):
    return asyncio.run(coro)


def test_first_complete_groups_win_in_completion_order():
    async def body():
        buf = TrajectoryBuffer(batch_groups=2, capacity_groups=100)
        for i in range(3):
            await buf.put_group(group(f"g{i}", 0))
        batch = await buf.next_batch(1)
        assert [t.group_id for t in batch] == ["g0", "g0", "g1", "g1"]
        stats = await buf.stats()
        assert (stats["groups/trained"], stats["buffer/depth"], stats["groups/arrived"]) == (2, 1, 3)
        metrics = await buf.pop_step_metrics(1)
        assert metrics["staleness/mean"] == 0
        assert metrics["reward/mean"] == 0.5  # rewards 0 and 1 in each group
        assert metrics["response_length/mean"] == 1
    run(body())


def test_stale_groups_are_trained_by_default_and_dropped_with_drop_stale():
    async def body():
        for drop in (False, True):
            dropped = []
            buf = TrajectoryBuffer(batch_groups=1, max_staleness=1, capacity_groups=10, drop_stale=drop)
            buf.set_drop_listener(dropped.append)
            await buf.put_group(group("late", 0, length=9))
            await buf.put_group(group("fresh", 2))
            batch = await buf.next_batch(3)  # step 3 trains version 2: 'late' has staleness 2 > 1
            stats = await buf.stats()
            metrics = await buf.pop_step_metrics(3)
            if drop:
                assert {t.group_id for t in batch} == {"fresh"}
                assert stats["groups/dropped_stale"] == 1 and dropped == [1]
                assert metrics["response_length/dropped_group_mean"] == 9
            else:
                assert {t.group_id for t in batch} == {"late"}  # completion order, whatever its age
                assert metrics["staleness/max"] == 2 and stats["groups/dropped_stale"] == 0 and dropped == []
    run(body())


def test_a_step_asked_for_again_is_told_to_the_listener_once_per_repeat():
    class Listener:
        def __init__(self):
            self.repeats, self.drops = [], []

        def learner_repeats(self, steps):
            self.repeats.append(steps)

        def dropped(self, count):
            self.drops.append(count)

    async def body():
        listener = Listener()
        buf = TrajectoryBuffer(batch_groups=1, capacity_groups=10)
        buf.set_drop_listener(listener)
        for i in range(5):
            await buf.put_group(group(f"g{i}", 0))
        for step in (1, 2, 3):
            await buf.next_batch(step)
        assert listener.repeats == []
        await buf.next_batch(2, policy_version=4)  # a learner restarted from the step-1 checkpoint
        await buf.next_batch(3, policy_version=5)
        assert listener.repeats == [1, 1] and listener.drops == []
    run(body())


def test_long_share_trained_vs_generated_shows_a_short_bias():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, capacity_groups=100, drop_stale=True, max_staleness=0)
        for i in range(9):
            await buf.put_group(group(f"short{i}", 0, length=10))
        await buf.put_group(group("long", 0, length=100))
        for i in range(9):  # version 0 → trained at step 1..; 'long' waits and becomes stale
            await buf.next_batch(1)
        await buf.put_group(group("next", 1, length=10))
        await buf.next_batch(2)  # drops 'long' (staleness 1 > 0)
        m = await buf.pop_step_metrics(2)
        assert m["response_length/long_threshold"] == 10  # p90 of 20 short + 2 long samples
        assert m["long_share/generated"] == pytest.approx(2 / 22)
        assert m["long_share/trained"] == 0  # every long sample was dropped
        assert m["tokens/generated_per_trained"] == pytest.approx((21 * 10 + 2 * 100 - 10) / (20 * 10))
        assert m["response_length/generated_mean"] == 10  # only 'next' arrived since the previous batch
    run(body())


def test_a_full_queue_makes_producers_wait_instead_of_dropping():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, capacity_groups=1)
        await buf.put_group(group("a", 0))
        blocked = asyncio.create_task(buf.put_group(group("b", 0)))
        await asyncio.sleep(0.05)
        assert not blocked.done() and (await buf.stats())["buffer/depth"] == 1
        assert {t.group_id for t in await buf.next_batch(1)} == {"a"}
        await asyncio.wait_for(blocked, 1)
        assert {t.group_id for t in await buf.next_batch(2)} == {"b"}
    run(body())


def test_discarded_groups_are_unqueued_and_never_queued_later():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, capacity_groups=10)
        await buf.put_group(group("early", 0))
        await buf.discard(["early", "late"])
        await buf.put_group(group("late", 0))
        assert (await buf.stats())["buffer/depth"] == 0
        assert await buf.arrived(["early", "late", "never"]) == ["early"]
    run(body())


def test_close_releases_learner():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=0)
        waiter = asyncio.create_task(buf.next_batch(1))
        await asyncio.sleep(0.01)
        await buf.close()
        assert await asyncio.wait_for(waiter, 1) is None
    run(body())


def test_steps_count_from_one():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=0)
        with pytest.raises(ValueError, match="count from 1"):
            await buf.next_batch(0)
    run(body())


def test_mixed_group_rejected():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=0)
        with pytest.raises(ValueError, match="several groups"):
            await buf.put_group(group("a", 0) + group("b", 0))
    run(body())


def test_token_staleness_uses_each_tokens_sampling_version():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, capacity_groups=10)
        spans = Trajectory(trajectory_id="s-0", group_id="s", prompt_ids=(1,), response_ids=(5, 6, 7, 8),
                           response_mask=(1, 1, 0, 1), rollout_logprobs=(-1.0, -1.0, 0.0, -1.0), reward=1.0,
                           policy_version=1, token_versions=(1, 2, -1, 3))
        plain = Trajectory(trajectory_id="s-1", group_id="s", prompt_ids=(1,), response_ids=(5, 6),
                           response_mask=(1, 1), rollout_logprobs=(-1.0, -1.0), reward=0.0, policy_version=3)
        await buf.put_group([spans, plain])
        await buf.next_batch(4)  # learner version 3
        m = await buf.pop_step_metrics(4)
        assert m["staleness/max"] == 2  # the group's oldest token
        assert m["staleness/token_mean"] == pytest.approx((2 + 1 + 0 + 0 + 0) / 5)
        assert m["staleness/older_token_share"] == pytest.approx(2 / 5)
    run(body())
