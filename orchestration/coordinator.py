"""The coordinator: keeps agent workers busy with prompt groups, within the admission bound
(orchestration layer: wires deployments' agent workers to the trainers' buffer and admission controller).

A Ray async actor. It walks the training rows epoch by epoch (shuffled with the run seed), asks its
``AdmissionController`` for tickets, and hands each admitted row to the least busy agent worker. A worker
puts the finished group into the buffer itself; when its call returns the ticket is finished, and a worker
error is counted as failed (the slot goes back), so every admitted group is accounted for. It sleeps until
something changes: the publisher pushes each new version (``on_publish``), a group ends, the buffer reports
dropped groups (``dropped``) or a step the restarted learner trains again (``learner_repeats``), or ``stop``. With ``abort_stale`` (the older behaviour, for comparison) a publish
cancels the groups that started too long ago; by default every admitted group finishes and is trained.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import ray

from agents.data.rows import DatasetRow
from trainers.admission import AdmissionController, Ticket

log = logging.getLogger("tandem_rl.coordinator")


class RowCursor:
    """Rows in epoch order, reshuffled per epoch; ``position`` is the resumable data cursor."""

    def __init__(self, rows: list[DatasetRow], *, seed: int, shuffle: bool, start: int = 0):
        if not rows:
            raise ValueError("no training rows")
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.position = start

    def next(self) -> tuple[int, DatasetRow]:
        epoch, offset = divmod(self.position, len(self.rows))
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        self.position += 1
        return self.position - 1, self.rows[order[offset]]


class Coordinator:
    """Keeps the agent workers busy with admitted prompt groups (module docstring); runs as a Ray async actor."""

    def __init__(self, rows: list[DatasetRow], workers: list[Any], buffer: Any, admission: AdmissionController, *,
                 seed: int = 1, shuffle: bool = True, start_position: int = 0, max_in_flight: int = 256,
                 run_id: str = "run", max_consecutive_failures: int | None = None):
        bad = [i for i, row in enumerate(rows) if not isinstance(row, DatasetRow)]
        if bad:
            raise TypeError(f"Coordinator: rows {bad[:5]} are not DatasetRow (load them with agents.data.rows)")
        self.cursor = RowCursor(rows, seed=seed, shuffle=shuffle, start=start_position)
        self.workers = workers
        self.busy = [0] * len(workers)
        self.alive = [True] * len(workers)  # a worker whose actor died is taken out of the pool, once
        self.redispatched = 0
        self._retries_by_worker = [0.0] * len(workers)
        self.buffer = buffer
        self.admission = admission
        self.max_in_flight = max_in_flight
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.run_id = run_id
        self._in_flight: dict[int, tuple[str, Any]] = {}  # ticket id -> (group id, worker call)
        self._aborted: set[int] = set()
        self.finished_episodes = 0
        self._t0 = time.perf_counter()
        # failures in a row (no group finished in between) before the run is stopped instead of retried forever
        self.max_consecutive_failures = max_consecutive_failures or max(8, 4 * admission.batch_groups)
        self._failures_in_a_row = 0
        self.error: str | None = None

    async def run(self) -> dict[str, float]:
        """Dispatch until ``stop()``; returns the final stats (after reconciling what was in flight)."""
        while not self._stop.is_set():
            self._wake.clear()
            tickets = self.admission.admit(self.max_in_flight - len(self._tasks))
            for ticket in tickets:
                self._dispatch(ticket)
            if not tickets:
                await self._wake.wait()  # a publish, a group's end, a drop or stop() sets it
        for task in list(self._tasks):
            task.cancel()
        for _, call in self._in_flight.values():  # stop generating for a run that is over
            _cancel(call)
        await self._reconcile()
        return self.stats()

    async def on_publish(self, version: int) -> int:
        """The learner published ``version`` (pushed by the publisher). Returns how many groups it aborted."""
        doomed = self.admission.on_publish(version)
        if doomed:  # first out of the queue (a group may have arrived before its call returned), then cancelled
            await self.buffer.discard.remote([self._in_flight[t.id][0] for t in doomed if t.id in self._in_flight])
        for ticket in doomed:
            self._aborted.add(ticket.id)
            _group_id, call = self._in_flight.get(ticket.id, (None, None))
            if call is not None:
                _cancel(call)
        self._wake.set()
        return len(doomed)

    async def learner_repeats(self, steps: int) -> None:
        """The learner (restarted from a checkpoint) asks for a step's batch again: one more batch to admit."""
        self.admission.learner_repeats(steps)
        self._wake.set()

    async def dropped(self, count: int) -> None:
        """The buffer discarded ``count`` finished groups as too stale: their slots go back."""
        self.admission.dropped(count)
        self._wake.set()

    def _dispatch(self, ticket: Ticket, again: tuple[int, DatasetRow] | None = None) -> None:
        """Start a group for ``ticket`` on the least busy live worker: the next row, or ``again`` (the row of a
        group whose worker died, sent once more under a new group id)."""
        live = [w for w in range(len(self.workers)) if self.alive[w]]
        if not live:  # every worker died (the run is stopping): nothing can run it
            self.admission.failed(ticket.id)
            return
        index, row = again or self.cursor.next()
        worker = min(live, key=self.busy.__getitem__)
        self.busy[worker] += 1
        group_id = f"{self.run_id}-g{index}-r{row.extra_info.index}" + ("-again" if again else "")
        # step: the policy version that admitted the group (traces are tagged and capped per step), not the row index
        call = self.workers[worker].run_rows.remote([row], step=ticket.version, group_ids=[group_id])
        self._in_flight[ticket.id] = (group_id, call)
        task = asyncio.create_task(self._run_group(worker, index, row, ticket, call, again=again is not None))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_group(self, worker: int, index: int, row: DatasetRow, ticket: Ticket, call: Any, *,
                         again: bool = False) -> None:
        try:
            stats = await call
            self.admission.finished(ticket.id)
            self.finished_episodes += int(stats.get("num_trajectories", 0))
            self._retries_by_worker[worker] = max(self._retries_by_worker[worker],
                                                  stats.get("generate_retries_total", 0.0))
            self._failures_in_a_row = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a fault boundary: one bad group must not stop training
            if isinstance(exc, ray.exceptions.TaskCancelledError) and ticket.id in self._aborted:
                return  # counted as aborted when the publish made it too stale
            if isinstance(exc, ray.exceptions.RayActorError) and await self._worker_died(worker, index, row,
                                                                                         ticket, again):
                return  # sent to another worker under the same ticket
            log.warning("group for row %s failed on worker %d: %s", row.extra_info.index, worker, exc)
            self.admission.failed(ticket.id)
            self._failures_in_a_row += 1
            if self._failures_in_a_row >= self.max_consecutive_failures and self.error is None:
                await self._fail(f"{self._failures_in_a_row} groups failed in a row (the last, row "
                                 f"{row.extra_info.index}: {type(exc).__name__}: {exc}); stopping instead of retrying")
        finally:
            self.busy[worker] -= 1
            if self._in_flight.get(ticket.id, (None, None))[1] is call:  # not re-dispatched under this ticket
                self._in_flight.pop(ticket.id, None)
            self._wake.set()

    async def _worker_died(self, worker: int, index: int, row: DatasetRow, ticket: Ticket, again: bool) -> bool:
        """An agent worker's actor died under this group: take it out of the pool (said once) and send the group
        once more to a live worker. False when the group counts as failed instead (sent once already, or no
        worker is left)."""
        if self.alive[worker]:
            self.alive[worker] = False
            left = sum(self.alive)
            log.error("agent worker %d died; taken out of the pool (%d left), its groups go to the others once",
                      worker, left)
            if not left:
                await self._fail("every agent worker died")
                return False
        group_id = self._in_flight.get(ticket.id, (None, None))[0]
        if group_id is not None and await self.buffer.arrived.remote([group_id]):
            self.admission.finished(ticket.id)  # it reached the queue before the worker died
            return True
        if again or not any(self.alive) or self._stop.is_set():
            return False
        self.redispatched += 1
        self._dispatch(ticket, again=(index, row))
        return True

    async def _fail(self, error: str) -> None:
        if self.error is not None:
            return
        self.error = error
        log.error("%s", error)
        await self.buffer.close.remote()  # the learner's next_batch returns None: the run ends
        self.stop()  # after the close: stopping cancels the calling task

    async def _reconcile(self) -> None:
        """At stop: a cancelled call may have put its group already; such a ticket finished (it is queued). The
        buffer is sealed first, so a put still in transit cannot land after this count."""
        pending = {group_id: ticket_id for ticket_id, (group_id, _) in self._in_flight.items()
                   if ticket_id not in self._aborted}  # before any await: cancelled tasks unregister their calls
        await self.buffer.seal.remote()
        if pending:
            for group_id in await self.buffer.arrived.remote(list(pending)):
                self.admission.finished(pending[group_id])

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def failure(self) -> str | None:
        """Why the coordinator stopped the run on its own (None: it did not)."""
        return self.error

    def stats(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._t0
        return {
            **self.admission.stats(),
            "groups/redispatched": float(self.redispatched),
            "agent_workers/alive": float(sum(self.alive)),
            "rollout/generate_retries": float(sum(self._retries_by_worker)),
            "rollout/episodes_per_s": self.finished_episodes / elapsed if elapsed > 0 else 0.0,
            "data/cursor": float(self.cursor.position),
        }


def _cancel(call: Any) -> None:
    """Cancel a worker call: a Ray task (``ObjectRef``) or an in-process awaitable (tests, benchmarks)."""
    if isinstance(call, ray.ObjectRef):
        ray.cancel(call)
    elif hasattr(call, "cancel"):
        call.cancel()


CoordinatorActor = ray.remote(num_cpus=0)(Coordinator).options(max_concurrency=1000)


def accounting(admission: dict[str, float], buffer: dict[str, float]) -> dict[str, float]:
    """Every admitted group in exactly one bucket, each counted on its own side: trained, dropped (queue) and the
    queue depth by the buffer; failed, aborted and in flight by the admission controller. ``balanced`` is 1 when
    admitted equals their sum (it is not defined as a remainder, so the check can fail)."""
    buckets = {
        "groups/trained": buffer["groups/trained"],
        "groups/dropped_stale": buffer["groups/dropped_stale"],
        "groups/aborted_in_flight": admission["groups/aborted_in_flight"],
        "groups/failed": admission["groups/failed"],
        "groups/left_over": buffer["buffer/depth"] + admission["groups/in_flight"],
    }
    total = sum(buckets.values())
    return {"groups/admitted": admission["groups/admitted"], **buckets,
            "groups/balanced": float(total == admission["groups/admitted"])}
