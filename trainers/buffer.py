"""The trajectory buffer between agent workers and the learner (trainers layer).

A plain asyncio class; ``apps/`` runs it as a Ray async actor. Agent workers ``put_group`` finished
groups; the learner's ``next_batch(step)`` takes the first ``batch_groups`` groups that are fresh
enough, in completion order. Steps count from 1 and step ``s`` trains policy version ``s - 1``, so
the staleness of a group trained at step ``s`` is ``s - 1 - policy_version`` (the oldest adapter
version that sampled any of its tokens); groups beyond ``max_staleness`` are
dropped and counted. Admission (``admit``) bounds how far generation may run ahead of the learner:
at learner version ``v`` at most ``(v + max_staleness + 1) × batch_groups`` groups are ever started.
In synchronous mode a batch's groups are only admitted once the previous step's adapter is
published, and the learner waits for all of them. A group still in flight that can no longer be fresh
(``staleness_window``) may be ``abandon``ed by the coordinator: it is counted as dropped_stale (and
``aborted_in_flight``) at once, its slot goes back to admission, and its late ``put_group`` is ignored.

Every admitted group ends in exactly one bucket: trained, dropped_stale, failed, or left over
(still queued or in flight at shutdown).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from agents.records import Trajectory


@dataclass
class BufferStats:
    admitted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    failed: int = 0
    completed: int = 0
    aborted: int = 0  # abandoned while still in flight (also counted in dropped_stale)
    trained_trajectories: int = 0
    staleness: list[int] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.admitted - self.completed - self.failed - self.aborted

    def as_dict(self, depth: int, version: int) -> dict[str, float]:
        return {
            "buffer/depth": float(depth),
            "buffer/in_flight": float(self.in_flight),
            "groups/admitted": float(self.admitted),
            "groups/trained": float(self.trained),
            "groups/dropped_stale": float(self.dropped_stale),
            "groups/aborted_in_flight": float(self.aborted),
            "groups/failed": float(self.failed),
            "groups/left_over": float(self.admitted - self.trained - self.dropped_stale - self.failed),
            "trajectories/trained": float(self.trained_trajectories),
            "policy_version": float(version),
        }


def batch_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Rollout metrics of one training batch."""
    n = len(trajectories)
    rewards = [t.reward for t in trajectories]
    mean = sum(rewards) / n
    lengths = [len(t.response_ids) for t in trajectories]
    out = {
        "reward/mean": mean,
        "reward/std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "reward/max": max(rewards),
        "response_length/mean": sum(lengths) / n,
        "response_length/max": float(max(lengths)),
        "policy_tokens/mean": sum(t.num_policy_tokens for t in trajectories) / n,
        "turns/mean": sum(t.num_turns for t in trajectories) / n,
        "tool_calls/mean": sum(t.num_tool_calls for t in trajectories) / n,
        "tool_errors/sum": float(sum(t.num_tool_errors for t in trajectories)),
        "tool_parse_errors/sum": float(sum(t.num_parse_errors for t in trajectories)),
    }
    for t in trajectories:
        key = f"termination/{t.termination.value}"
        out[key] = out.get(key, 0.0) + 1.0 / n
    # The reward function's own numbers (verl's reward_extra_info, e.g. acc), next to reward/mean.
    for key in sorted({k for t in trajectories for k in t.reward_extra}):
        values = [t.reward_extra[key] for t in trajectories if key in t.reward_extra]
        out[f"reward/{key}"] = sum(values) / len(values)
    return out


class TrajectoryBuffer:
    """Bounded group queue with staleness-aware admission (see module docstring)."""

    def __init__(self, batch_groups: int, max_staleness: int, capacity_groups: int | None = None,
                 streaming: bool = True, keep_batches: bool = False):
        if batch_groups < 1 or max_staleness < 0:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1 and max_staleness={max_staleness} >= 0")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness if streaming else 0
        self.streaming = streaming
        self.capacity = max(capacity_groups or 2 * batch_groups, batch_groups)
        self.version = 0
        self.closed = False
        self._groups: deque[list[Trajectory]] = deque()
        self._stats = BufferStats()
        self._changed = asyncio.Condition()
        self._batch_staleness: list[int] = []
        self._batch_wait_s = 0.0
        self._step_metrics: dict[int, dict[str, float]] = {}
        self.keep_batches = keep_batches  # for trainer.rollout_data_dir dumps
        self._step_batches: dict[int, list[Trajectory]] = {}
        self._arrived: set[str] = set()  # group ids put so far
        self._abandoned: set[str] = set()

    # ---- producer side -------------------------------------------------------------------
    async def admit(self, wanted: int) -> int:
        """Reserve up to ``wanted`` group slots the coordinator may start now (0 = wait)."""
        async with self._changed:
            if self.closed:
                return 0
            if self.streaming:
                limit = (self.version + self.max_staleness + 1) * self.batch_groups
            else:
                # Batch-synchronous: the batch for step v is admitted only once version v exists.
                limit = (self.version + 1) * self.batch_groups
            room = self.capacity - len(self._groups) - self._stats.in_flight
            # Dropped and failed groups give their slot back: the learner still needs a full batch.
            used = self._stats.admitted - self._stats.dropped_stale - self._stats.failed
            granted = max(0, min(wanted, limit - used, room))
            self._stats.admitted += granted
            return granted

    async def put_group(self, group: list[Trajectory]) -> None:
        """Store one finished group (all ``n`` samples of a prompt)."""
        if not group:
            raise ValueError("put_group: empty group")
        ids = {t.group_id for t in group}
        if len(ids) != 1:
            raise ValueError(f"put_group: trajectories of several groups in one call: {sorted(ids)}")
        group_id = next(iter(ids))
        async with self._changed:
            if group_id in self._abandoned:  # already counted as dropped_stale when it was abandoned
                return
            self._arrived.add(group_id)
            self._groups.append(list(group))
            self._stats.completed += 1
            self._changed.notify_all()

    async def staleness_window(self) -> tuple[int, int]:
        """``(version, oldest)``: the published policy version, and the oldest policy version a group may
        have and still be trained at the next step. A group started at a version below ``oldest`` is
        dropped when it arrives, whatever it holds."""
        return self.version, self.version - self.max_staleness

    async def abandon(self, group_id: str) -> bool:
        """Count the in-flight group ``group_id`` as dropped_stale now (the caller stops generating it).

        False when it has already arrived: then the queue's own staleness check counts it.
        """
        async with self._changed:
            if group_id in self._arrived or group_id in self._abandoned:
                return False
            self._abandoned.add(group_id)
            self._stats.dropped_stale += 1
            self._stats.aborted += 1
            self._changed.notify_all()
            return True

    async def mark_failed(self, count: int = 1) -> None:
        """Count admitted groups that failed (worker error) so nothing goes missing."""
        async with self._changed:
            self._stats.failed += count
            self._changed.notify_all()

    # ---- learner side --------------------------------------------------------------------
    async def next_batch(self, step: int) -> list[Trajectory] | None:
        """The first ``batch_groups`` fresh groups for training step ``step`` (1-based; None once closed)."""
        if step < 1:
            raise ValueError(f"next_batch: steps count from 1, got {step}")
        learner_version = step - 1
        start = time.perf_counter()
        async with self._changed:
            while True:
                self._drop_stale(learner_version)
                if len(self._groups) >= self.batch_groups and self._batch_ready():
                    break
                if self.closed:
                    return None
                await self._changed.wait()
            batch = [self._groups.popleft() for _ in range(self.batch_groups)]
            self._batch_staleness = [learner_version - min(t.policy_version for t in g) for g in batch]
            self._stats.staleness.extend(self._batch_staleness)
            self._stats.trained += len(batch)
            self._stats.trained_trajectories += sum(len(g) for g in batch)
            self._batch_wait_s = time.perf_counter() - start
            trajectories = [t for group in batch for t in group]
            if self.keep_batches:
                self._step_batches[step] = trajectories
            self._step_metrics[step] = {
                **batch_metrics(trajectories),
                "staleness/mean": sum(self._batch_staleness) / len(batch),
                "staleness/max": float(max(self._batch_staleness)),
                "timing/wait_batch_s": self._batch_wait_s,
            }
            self._changed.notify_all()
        return trajectories

    async def set_version(self, version: int) -> None:
        """The learner published ``version``; admission moves forward."""
        async with self._changed:
            self.version = max(self.version, version)
            self._changed.notify_all()

    async def close(self) -> None:
        async with self._changed:
            self.closed = True
            self._changed.notify_all()

    async def stats(self) -> dict[str, float]:
        return self._stats.as_dict(len(self._groups), self.version)

    async def pop_step_metrics(self, step: int) -> dict[str, float]:
        """Rollout metrics of the batch handed out for ``step`` (reward, lengths, tools, staleness)."""
        return self._step_metrics.pop(step, {})

    async def pop_step_batch(self, step: int) -> list[Trajectory]:
        """The trajectories handed out for ``step`` (kept only with ``keep_batches``)."""
        return self._step_batches.pop(step, [])

    # ---- internals -----------------------------------------------------------------------
    def _batch_ready(self) -> bool:
        # Synchronous baseline: train only when the whole admitted batch has finished.
        return self.streaming or self._stats.in_flight == 0

    def _drop_stale(self, learner_version: int) -> None:
        fresh = deque(g for g in self._groups
                      if learner_version - min(t.policy_version for t in g) <= self.max_staleness)
        self._stats.dropped_stale += len(self._groups) - len(fresh)
        self._groups = fresh
