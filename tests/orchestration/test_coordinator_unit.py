"""The coordinator's dispatch loop in-process (fake workers and buffer, real AdmissionController): it sleeps until
something changes, stays within the admission bound, and stops a run whose groups keep failing."""

from __future__ import annotations

import asyncio

import pytest

from agents.data.rows import DatasetRow
from orchestration.coordinator import Coordinator
from trainers.admission import AdmissionController

pytestmark = pytest.mark.unit


def rows(count: int) -> list[DatasetRow]:
    return [DatasetRow.model_validate({
        "data_source": "t", "ability": "math", "prompt": [{"role": "user", "content": f"q{i}"}],
        "reward_model": {"ground_truth": "1"}, "extra_info": {"index": i, "question": f"q{i}", "answer": "1"}})
        for i in range(count)]


class Remote:
    """``obj.method.remote(...)`` → an awaitable, the way a Ray actor method is called."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return asyncio.ensure_future(self.fn(*args, **kwargs))


class FakeWorker:
    def __init__(self, fail: bool, hold: asyncio.Event | None = None):
        self.fail, self.hold, self.calls = fail, hold, 0

        async def run_rows(rows, step, group_ids):
            self.calls += 1
            if self.hold is not None:
                await self.hold.wait()
            if self.fail:
                raise ValueError("reward function raised")
            return {"num_trajectories": 2}

        self.run_rows = Remote(run_rows)


class FakeBuffer:
    def __init__(self):
        self.closed = False

        async def close():
            self.closed = True

        async def arrived(ids):
            return []

        async def seal():
            pass

        self.close, self.arrived, self.seal = Remote(close), Remote(arrived), Remote(seal)


class InProcess:
    """A real object's async methods called as ``obj.method.remote(...)``."""

    def __init__(self, obj):
        self.obj = obj

    def __getattr__(self, name):
        return Remote(getattr(self.obj, name))


@pytest.mark.parametrize("put", ["in transit", "queued"])
def test_a_group_whose_call_is_cut_at_stop_is_counted_once(put):
    """A worker call cancelled at stop. ``in transit``: its put was sent and lands after the coordinator stopped;
    the sealed buffer refuses it, so the group is left in flight (not also queued). ``queued``: the group reached
    the queue but the call had not returned; it counts as queued (not also in flight). Either way it balances."""
    from agents.records import Trajectory
    from orchestration.coordinator import accounting
    from trainers.buffer import TrajectoryBuffer

    async def body():
        buffer = TrajectoryBuffer(batch_groups=1, max_staleness=0)
        in_transit: list[asyncio.Future] = []
        sent = asyncio.Event()

        async def run_rows(rows, step, group_ids):
            group = [Trajectory(trajectory_id=f"{group_ids[0]}-0", group_id=group_ids[0], prompt_ids=(1,),
                                response_ids=(2,), response_mask=(1,), rollout_logprobs=(-0.1,), reward=1.0,
                                policy_version=0)]

            async def deliver():  # the message is on its way: cancelling the caller does not recall it
                await asyncio.sleep(0.2)
                await buffer.put_group(group)
            if put == "queued":
                await buffer.put_group(group)
            else:
                in_transit.append(asyncio.ensure_future(deliver()))
            sent.set()
            await asyncio.Event().wait()  # the worker call is cancelled at stop

        worker = type("Worker", (), {"run_rows": Remote(run_rows)})()
        coordinator = Coordinator(rows(2), [worker], InProcess(buffer), AdmissionController(1, 0))
        task = asyncio.create_task(coordinator.run())
        await asyncio.wait_for(sent.wait(), 5)
        coordinator.stop()
        final = await asyncio.wait_for(task, 5)
        await asyncio.gather(*in_transit)
        stats = await buffer.stats()
        book = accounting(final, stats)
        assert book["groups/admitted"] == 1 and book["groups/left_over"] == 1, book
        assert (stats["buffer/depth"], final["groups/in_flight"]) == ((1, 0) if put == "queued" else (0, 1))
        assert book["groups/balanced"] == 1, book
    asyncio.run(body())


def test_a_run_whose_groups_keep_failing_is_stopped_not_retried_forever():
    async def body():
        buffer, worker = FakeBuffer(), FakeWorker(fail=True)
        coordinator = Coordinator(rows(3), [worker], buffer, AdmissionController(2, 1), max_consecutive_failures=5)
        stats = await asyncio.wait_for(coordinator.run(), 5)
        assert buffer.closed and "5 groups failed in a row" in coordinator.failure()
        assert "ValueError: reward function raised" in coordinator.failure()
        assert stats["groups/failed"] >= 5 and worker.calls == stats["groups/admitted"]
    asyncio.run(body())


def test_dispatch_waits_at_the_bound_and_a_publish_wakes_it():
    async def body():
        hold = asyncio.Event()
        worker = FakeWorker(fail=False, hold=hold)
        coordinator = Coordinator(rows(10), [worker], FakeBuffer(), AdmissionController(2, 1))
        task = asyncio.create_task(coordinator.run())
        await asyncio.sleep(0.05)
        assert worker.calls == 4  # (0 + 1 + 1) × 2, then it sleeps (no polling: nothing else is started)
        hold.set()
        await asyncio.sleep(0.05)
        assert worker.calls == 4 and coordinator.stats()["groups/in_flight"] == 0  # finishing frees nothing
        assert await coordinator.on_publish(1) == 0
        await asyncio.sleep(0.05)
        assert worker.calls == 6
        coordinator.stop()
        stats = await asyncio.wait_for(task, 5)
        assert stats["groups/admitted"] == 6 and coordinator.failure() is None
    asyncio.run(body())


def test_a_dead_agent_worker_leaves_the_pool_once_and_its_group_runs_elsewhere(caplog):
    """The first worker's actor dies under its group: said once, never dispatched to again, the group runs once
    more on the other worker under the same ticket (nothing failed)."""
    import ray

    async def body():
        dead_calls, live_calls = [], []

        async def dies(rows, step, group_ids):
            dead_calls.append(group_ids[0])
            raise ray.exceptions.ActorDiedError()

        async def works(rows, step, group_ids):
            live_calls.append(group_ids[0])
            await asyncio.sleep(0.01)
            return {"num_trajectories": 2}

        dead = type("Dead", (), {"run_rows": Remote(dies)})()
        live = type("Live", (), {"run_rows": Remote(works)})()
        coordinator = Coordinator(rows(8), [dead, live], FakeBuffer(), AdmissionController(2, 0))
        task = asyncio.create_task(coordinator.run())
        await asyncio.sleep(0.3)
        coordinator.stop()
        stats = await asyncio.wait_for(task, 5)
        assert len(dead_calls) == 1 and any(g.endswith("-again") for g in live_calls)
        assert dead_calls[0] + "-again" in live_calls
        assert stats["groups/failed"] == 0 and stats["groups/redispatched"] == 1
        assert stats["agent_workers/alive"] == 1
    asyncio.run(body())
    assert sum("agent worker 0 died" in r.getMessage() for r in caplog.records) == 1


def test_every_worker_dead_stops_the_run_with_an_error():
    import ray

    async def body():
        async def dies(rows, step, group_ids):
            raise ray.exceptions.ActorDiedError()

        buffer = FakeBuffer()
        workers = [type("Dead", (), {"run_rows": Remote(dies)})() for _ in range(2)]
        coordinator = Coordinator(rows(8), workers, buffer, AdmissionController(2, 0))
        stats = await asyncio.wait_for(coordinator.run(), 5)
        assert coordinator.failure() == "every agent worker died" and buffer.closed
        assert stats["groups/admitted"] == stats["groups/failed"] + stats["groups/in_flight"]
    asyncio.run(body())


def test_groups_carry_the_policy_version_that_admitted_them_as_their_step():
    """Traces are tagged and capped per training step: the step a group carries is its admission version."""
    async def body():
        steps = []

        async def run_rows(rows, step, group_ids):
            steps.append(step)
            await asyncio.sleep(3600)

        worker = type("Worker", (), {"run_rows": Remote(run_rows)})()
        coordinator = Coordinator(rows(20), [worker], FakeBuffer(), AdmissionController(2, 0))
        task = asyncio.create_task(coordinator.run())
        await asyncio.sleep(0.05)
        await coordinator.on_publish(1)
        await asyncio.sleep(0.05)
        coordinator.stop()
        await asyncio.wait_for(task, 5)
        assert steps == [0, 0, 1, 1]  # (0 + 0 + 1) × 2 at version 0, two more at version 1
    asyncio.run(body())
