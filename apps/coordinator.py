"""The coordinator: keeps agent workers busy with prompt groups, within the buffer's admission bound
(apps layer: wires deployments' agent workers to the trainers' buffer).

A Ray async actor. It walks the training rows epoch by epoch (shuffled with the run seed), asks the
``TrajectoryBuffer`` how many groups it may start (``admit``), and hands each admitted row to the
least busy agent worker. A worker puts the finished group into the buffer itself; a worker error
is counted in the buffer (``mark_failed``) so that every admitted group is accounted for. A group
still generating when the learner has moved past what it could ever be trained with (it started at a
policy version below the buffer's ``staleness_window``) is abandoned: counted as dropped_stale at
once and cancelled, so its slot and its engine rows go to groups that can still be trained.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import ray

log = logging.getLogger("tandem_rl.coordinator")


class RowCursor:
    """Rows in epoch order, reshuffled per epoch; ``position`` is the resumable data cursor."""

    def __init__(self, rows: list[dict[str, Any]], *, seed: int, shuffle: bool, start: int = 0):
        if not rows:
            raise ValueError("no training rows")
        self.rows = rows
        self.seed = seed
        self.shuffle = shuffle
        self.position = start

    def next(self) -> tuple[int, dict[str, Any]]:
        epoch, offset = divmod(self.position, len(self.rows))
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        self.position += 1
        return self.position - 1, self.rows[order[offset]]


class Coordinator:
    def __init__(self, rows: list[dict[str, Any]], workers: list[Any], buffer: Any, *, seed: int = 1,
                 shuffle: bool = True, start_position: int = 0, max_in_flight: int = 256, run_id: str = "run"):
        self.cursor = RowCursor(rows, seed=seed, shuffle=shuffle, start=start_position)
        self.workers = workers
        self.busy = [0] * len(workers)
        self.buffer = buffer
        self.max_in_flight = max_in_flight
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.run_id = run_id
        self._in_flight: dict[str, tuple[int, Any]] = {}  # group id -> (version it started at, worker call)
        self._abandoned: set[str] = set()
        self.started_groups = 0
        self.finished_groups = 0
        self.failed_groups = 0
        self.finished_episodes = 0
        self._t0 = time.perf_counter()

    async def run(self) -> dict[str, float]:
        """Dispatch until ``stop()``; returns the final stats."""
        while not self._stop.is_set():
            want = self.max_in_flight - len(self._tasks)
            # Read before admitting: a publish landing in between must not make a group look newer than
            # the version it was admitted under (it would then never be abandoned).
            version, oldest = await self.buffer.staleness_window.remote()
            granted = await self.buffer.admit.remote(want) if want > 0 else 0
            for _ in range(granted):
                self._dispatch(version)
            await self._abandon_older_than(oldest)
            if granted == 0:
                # Nothing to start: wait for a group to finish or for the learner to move on.
                await asyncio.sleep(0.05)
        for task in list(self._tasks):
            task.cancel()
        for _, call in self._in_flight.values():  # stop generating for a run that is over
            ray.cancel(call)
        return self.stats()

    def _dispatch(self, version: int) -> None:
        index, row = self.cursor.next()
        worker = min(range(len(self.workers)), key=self.busy.__getitem__)
        self.busy[worker] += 1
        self.started_groups += 1
        group_id = f"{self.run_id}-g{index}-r{row.get('extra_info', {}).get('index', index)}"
        call = self.workers[worker].run_rows.remote([row], step=index, group_ids=[group_id])
        # the version read before admission: the group's tokens are sampled by this version or a newer one
        self._in_flight[group_id] = (version, call)
        task = asyncio.create_task(self._run_group(worker, row, group_id, call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _abandon_older_than(self, oldest: int) -> None:
        for group_id, (version, call) in list(self._in_flight.items()):
            if version < oldest and await self.buffer.abandon.remote(group_id):
                self._abandoned.add(group_id)
                ray.cancel(call)

    async def _run_group(self, worker: int, row: dict[str, Any], group_id: str, call: Any) -> None:
        try:
            stats = await call
            self.finished_groups += 1
            self.finished_episodes += int(stats.get("num_trajectories", 0))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a fault boundary: one bad group must not stop training
            if isinstance(exc, ray.exceptions.TaskCancelledError) and group_id in self._abandoned:
                return  # counted as dropped_stale by the buffer when it was abandoned
            log.warning("group for row %s failed on worker %d: %s", row.get("extra_info", {}).get("index"),
                        worker, exc)
            self.failed_groups += 1
            await self.buffer.mark_failed.remote(1)
        finally:
            self.busy[worker] -= 1
            self._in_flight.pop(group_id, None)

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._t0
        return {
            "rollout/groups_started": float(self.started_groups),
            "rollout/groups_finished": float(self.finished_groups),
            "rollout/groups_failed": float(self.failed_groups),
            "rollout/groups_abandoned": float(len(self._abandoned)),
            "rollout/episodes_per_s": self.finished_episodes / elapsed if elapsed > 0 else 0.0,
            "data/cursor": float(self.cursor.position),
        }


CoordinatorActor = ray.remote(num_cpus=0)(Coordinator).options(max_concurrency=1000)
