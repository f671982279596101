"""TrajectoryBuffer: admission bounds staleness, stale groups are dropped and counted, sync mode waits."""

import asyncio

import pytest

from agents.records import Trajectory
from trainers.buffer import TrajectoryBuffer

pytestmark = pytest.mark.unit


def group(gid: str, version: int, n: int = 2) -> list[Trajectory]:
    return [
        Trajectory(trajectory_id=f"{gid}-{i}", group_id=gid, prompt_ids=(1, 2), response_ids=(3,),
                   response_mask=(1,), rollout_logprobs=(-0.5,), reward=float(i), policy_version=version)
        for i in range(n)
    ]


def run(coro):
    return asyncio.run(coro)


def test_admission_bounded_by_staleness():
    async def body():
        buf = TrajectoryBuffer(batch_groups=2, max_staleness=1, capacity_groups=100)
        assert await buf.admit(10) == 4  # (0 + 1 + 1) × 2
        assert await buf.admit(10) == 0
        for i in range(4):
            await buf.put_group(group(f"g{i}", 0))
        batch = await buf.next_batch(1)
        assert [t.group_id for t in batch] == ["g0", "g0", "g1", "g1"]
        await buf.set_version(1)
        assert await buf.admit(10) == 2  # (1 + 1 + 1) × 2 − 4
        stats = await buf.stats()
        assert stats["groups/trained"] == 2
        metrics = await buf.pop_step_metrics(1)
        assert metrics["staleness/mean"] == 0
        assert metrics["reward/mean"] == 0.5  # rewards 0 and 1 in each group
        assert metrics["response_length/mean"] == 1
    run(body())


def test_first_complete_groups_win_and_stale_are_dropped():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=1, capacity_groups=10)
        assert await buf.admit(3) == 2  # (0 + 1 + 1) × 1
        await buf.put_group(group("late", 0))
        await buf.set_version(2)
        await buf.put_group(group("fresh", 2))
        batch = await buf.next_batch(3)  # step 3 trains version 2: 'late' has staleness 2 > 1
        assert {t.group_id for t in batch} == {"fresh"}
        stats = await buf.stats()
        assert stats["groups/dropped_stale"] == 1
        assert stats["groups/trained"] == 1
        # the dropped slot is given back to admission
        assert await buf.admit(10) == 3  # limit (2+1+1)×1 − used (2 admitted − 1 dropped)
    run(body())


def test_accounting_adds_up():
    async def body():
        buf = TrajectoryBuffer(batch_groups=2, max_staleness=0, capacity_groups=10)
        assert await buf.admit(5) == 2
        await buf.put_group(group("a", 0))
        await buf.mark_failed(1)
        assert await buf.admit(5) == 1  # the failed slot is re-admitted
        await buf.put_group(group("b", 0))
        await buf.next_batch(1)
        stats = await buf.stats()
        total = stats["groups/trained"] + stats["groups/dropped_stale"] + stats["groups/failed"] + stats["groups/left_over"]
        assert stats["groups/admitted"] == 3 and total == 3
        assert stats["groups/left_over"] == 0
    run(body())


def test_abandoned_in_flight_group_is_counted_once_and_frees_its_slot():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=1, capacity_groups=10)
        assert await buf.admit(5) == 2  # groups "slow" and "quick", both started at version 0
        await buf.put_group(group("quick", 0))
        await buf.next_batch(1)
        await buf.set_version(2)
        assert await buf.staleness_window() == (2, 1)  # version 0 can no longer be trained
        assert await buf.abandon("slow") is True
        assert await buf.abandon("slow") is False  # counted once
        assert await buf.abandon("quick") is False  # it arrived: not in flight
        await buf.put_group(group("slow", 0))  # a late arrival of the abandoned group is ignored
        stats = await buf.stats()
        assert (stats["groups/dropped_stale"], stats["groups/aborted_in_flight"], stats["buffer/depth"]) == (1, 1, 0)
        assert stats["buffer/in_flight"] == 0 and stats["groups/left_over"] == 0
        # limit (2 + 1 + 1) × 1 − used (2 admitted − 1 dropped) = 3
        assert await buf.admit(10) == 3
    run(body())


def test_sync_mode_waits_for_whole_batch_and_version():
    async def body():
        buf = TrajectoryBuffer(batch_groups=2, max_staleness=3, streaming=False)
        assert await buf.admit(10) == 2
        await buf.put_group(group("a", 0))
        waiter = asyncio.create_task(buf.next_batch(1))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # one group still in flight
        await buf.put_group(group("b", 0))
        assert len(await asyncio.wait_for(waiter, 1)) == 4
        assert await buf.admit(10) == 0  # no generation until the adapter of step 0 is published
        await buf.set_version(1)
        assert await buf.admit(10) == 2
    run(body())


def test_close_releases_learner():
    async def body():
        buf = TrajectoryBuffer(batch_groups=1, max_staleness=0)
        waiter = asyncio.create_task(buf.next_batch(1))
        await asyncio.sleep(0.01)
        await buf.close()
        assert await asyncio.wait_for(waiter, 1) is None
        assert await buf.admit(1) == 0
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
