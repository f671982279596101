"""The trajectory buffer between agent workers and the learner (trainers layer): a bounded queue.

A plain asyncio class; ``orchestration.run`` runs it as a Ray async actor. Agent workers ``put_group`` finished
groups (waiting while the queue is full: back-pressure, nothing is lost); the learner's ``next_batch(step)``
takes the first ``batch_groups`` groups in completion order. Steps count from 1 and step ``s`` trains policy
version ``s - 1``, so the staleness of a group trained at step ``s`` is ``s - 1 - policy_version`` (the oldest
adapter version that sampled any of its tokens). How many groups may be generating is not decided here
(``trainers.admission`` does, in the coordinator). With ``drop_stale`` (``stream.abort_stale``, the older
behaviour kept for comparison) groups beyond ``max_staleness`` are dropped at ``next_batch``, counted with
their lengths, and reported to ``on_drop`` so that their admission slots go back.

Per step the buffer reports what could bias training toward short episodes: the mean response length of
what it trains and of what arrived since the previous batch, the share of *long* samples (above the 90th
percentile of every length generated so far) among everything trained vs everything generated, response
tokens generated per token trained, the mean length of dropped groups (their count is ``groups/dropped_stale``), and per policy token the
versions it lags the learner (``staleness/token_mean``) and the share sampled by an older version.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from agents.records import Trajectory


@dataclass
class BufferStats:
    """The buffer's running group counts, reported each step as ``groups/*`` and ``trajectories/trained``."""

    trained: int = 0
    dropped_stale: int = 0  # drop_stale only
    trained_trajectories: int = 0

    def as_dict(self, depth: int, arrived: int) -> dict[str, float]:
        return {
            "buffer/depth": float(depth),
            "groups/arrived": float(arrived),
            "groups/trained": float(self.trained),
            "groups/dropped_stale": float(self.dropped_stale),
            "trajectories/trained": float(self.trained_trajectories),
        }


def long_threshold(lengths: list[int]) -> float:
    """The 90th percentile of ``lengths`` (nearest rank): samples longer than it are *long*."""
    if not lengths:
        return 0.0
    ordered = sorted(lengths)
    return float(ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))])


def long_share(lengths: list[int], threshold: float) -> float:
    """Share of ``lengths`` above ``threshold`` (0 when empty)."""
    return sum(n > threshold for n in lengths) / len(lengths) if lengths else 0.0


class LengthLedger:
    """Response lengths generated, trained and dropped over the run (the long-tail bias check)."""

    def __init__(self) -> None:
        self.generated: list[int] = []
        self.trained: list[int] = []
        self.dropped_groups: list[float] = []  # mean response length of each dropped group
        self._since_batch: list[int] = []

    def arrived(self, group: list[Trajectory]) -> None:
        lengths = [len(t.response_ids) for t in group]
        self.generated.extend(lengths)
        self._since_batch.extend(lengths)

    def dropped(self, group: list[Trajectory]) -> None:
        self.dropped_groups.append(sum(len(t.response_ids) for t in group) / len(group))

    def step_metrics(self, batch: list[Trajectory]) -> dict[str, float]:
        lengths = [len(t.response_ids) for t in batch]
        self.trained.extend(lengths)
        threshold = long_threshold(self.generated)
        since, self._since_batch = self._since_batch, []
        out = {
            "response_length/trained_mean": sum(lengths) / len(lengths),
            "response_length/generated_mean": sum(since) / len(since) if since else float("nan"),
            "response_length/long_threshold": threshold,
            "long_share/trained": long_share(self.trained, threshold),
            "long_share/generated": long_share(self.generated, threshold),
            "tokens/generated_per_trained": sum(self.generated) / max(1, sum(self.trained)),
        }
        if self.dropped_groups:
            out["response_length/dropped_group_mean"] = sum(self.dropped_groups) / len(self.dropped_groups)
        return out


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
    """Bounded group queue (see module docstring)."""

    def __init__(self, batch_groups: int, capacity_groups: int | None = None, *, max_staleness: int = 1,
                 drop_stale: bool = False, keep_batches: bool = False):
        if batch_groups < 1 or max_staleness < 0:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1 and max_staleness={max_staleness} >= 0")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.drop_stale = drop_stale
        # the admission bound keeps at most (max_staleness + 1) batches generated ahead of the learner
        self.capacity = max(capacity_groups or (max_staleness + 1) * batch_groups, batch_groups)
        self.closed = False
        self.sealed = False  # no more groups from producers (the coordinator stopped)
        self._groups: deque[list[Trajectory]] = deque()
        self._stats = BufferStats()
        self._lengths = LengthLedger()
        self._changed = asyncio.Condition()
        self._step_metrics: dict[int, dict[str, float]] = {}
        self.keep_batches = keep_batches  # for trainer.rollout_data_dir dumps
        self._step_batches: dict[int, list[Trajectory]] = {}
        self._arrived_ids: set[str] = set()
        self._discarded: set[str] = set()
        self._on_drop: Any = None
        self._last_step = 0  # the highest step a batch was handed out for

    def set_drop_listener(self, listener: Callable[[int], Any] | Any) -> None:
        """Who hears of dropped groups (``drop_stale``): a callable, or an object or actor handle with ``dropped``.
        One with ``learner_repeats`` also hears of each step the learner asks for again (restarted from a
        checkpoint): that batch is one more than the run's total, and admission must start it."""
        self._on_drop = listener

    # ---- producer side -------------------------------------------------------------------
    async def put_group(self, group: list[Trajectory]) -> None:
        """Store one finished group (all ``n`` samples of a prompt); waits while the queue is full."""
        if not group:
            raise ValueError("put_group: empty group")
        ids = {t.group_id for t in group}
        if len(ids) != 1:
            raise ValueError(f"put_group: trajectories of several groups in one call: {sorted(ids)}")
        group_id = next(iter(ids))
        async with self._changed:
            if group_id in self._discarded:  # aborted in flight: counted by admission already
                return
            await self._changed.wait_for(lambda: len(self._groups) < self.capacity or self.closed or self.sealed)
            if self.sealed:  # the run's dispatch is over and reconciled: admission counts it as left in flight
                return
            self._arrived_ids.add(group_id)
            self._groups.append(list(group))
            self._lengths.arrived(group)
            self._changed.notify_all()

    async def discard(self, group_ids: list[str]) -> None:
        """Groups aborted in flight (``abort_stale``): never queue them; unqueue one that arrived meanwhile."""
        async with self._changed:
            self._discarded.update(group_ids)
            self._groups = deque(g for g in self._groups if g[0].group_id not in self._discarded)
            self._changed.notify_all()

    async def seal(self) -> None:
        """Refuse every later group (a put may still be in transit when the coordinator stops): what arrived is
        final, so the end-of-run reconciliation cannot count a late group both queued and in flight."""
        async with self._changed:
            self.sealed = True
            self._changed.notify_all()

    async def arrived(self, group_ids: list[str]) -> list[str]:
        """Which of ``group_ids`` reached the queue (for the coordinator's end-of-run reconciliation)."""
        return [g for g in group_ids if g in self._arrived_ids]

    # ---- learner side --------------------------------------------------------------------
    async def next_batch(self, step: int, policy_version: int | None = None) -> list[Trajectory] | None:
        """The first ``batch_groups`` groups for training step ``step`` (1-based; None once closed), trained by the
        learner's ``policy_version`` (default ``step - 1``; higher after a learner restarted from a checkpoint)."""
        if step < 1:
            raise ValueError(f"next_batch: steps count from 1, got {step}")
        learner_version = step - 1 if policy_version is None else policy_version
        if step <= self._last_step and hasattr(self._on_drop, "learner_repeats"):
            _tell(self._on_drop.learner_repeats, 1)
        self._last_step = max(self._last_step, step)
        start = time.perf_counter()
        async with self._changed:
            while True:
                if self.drop_stale:
                    self._drop_stale(learner_version)
                if len(self._groups) >= self.batch_groups:
                    break
                if self.closed:
                    return None
                await self._changed.wait()
            batch = [self._groups.popleft() for _ in range(self.batch_groups)]
            staleness = [learner_version - min(t.policy_version for t in g) for g in batch]
            self._stats.trained += len(batch)
            self._stats.trained_trajectories += sum(len(g) for g in batch)
            trajectories = [t for group in batch for t in group]
            if self.keep_batches:
                self._step_batches[step] = trajectories
            lags = [learner_version - v for t in trajectories for v in t.policy_token_versions()]
            self._step_metrics[step] = {
                **batch_metrics(trajectories),
                **self._lengths.step_metrics(trajectories),
                "staleness/mean": sum(staleness) / len(batch),
                "staleness/max": float(max(staleness)),
                # per policy token, by the version that sampled it (a partial rollout spans several)
                "staleness/token_mean": sum(lags) / max(1, len(lags)),
                "staleness/older_token_share": sum(lag > 0 for lag in lags) / max(1, len(lags)),
                "timing/wait_batch_s": time.perf_counter() - start,
            }
            self._changed.notify_all()
        return trajectories

    async def close(self) -> None:
        async with self._changed:
            self.closed = True
            self._changed.notify_all()

    async def stats(self) -> dict[str, float]:
        return self._stats.as_dict(len(self._groups), len(self._arrived_ids))

    async def pop_step_metrics(self, step: int) -> dict[str, float]:
        """Rollout metrics of the batch handed out for ``step`` (reward, lengths, tools, staleness)."""
        return self._step_metrics.pop(step, {})

    async def pop_step_batch(self, step: int) -> list[Trajectory]:
        """The trajectories handed out for ``step`` (kept only with ``keep_batches``)."""
        return self._step_batches.pop(step, [])

    # ---- internals -----------------------------------------------------------------------
    def _drop_stale(self, learner_version: int) -> None:
        fresh: deque[list[Trajectory]] = deque()
        for g in self._groups:
            if learner_version - min(t.policy_version for t in g) <= self.max_staleness:
                fresh.append(g)
            else:
                self._lengths.dropped(g)
        dropped = len(self._groups) - len(fresh)
        self._groups = fresh
        if dropped:
            self._stats.dropped_stale += dropped
            self._changed.notify_all()  # room for producers
            if self._on_drop is not None:
                _tell(getattr(self._on_drop, "dropped", self._on_drop), dropped)


def _tell(method: Any, *args: Any) -> None:
    """Call a listener's method: an actor method without waiting for it (``.remote``), a plain one directly."""
    remote = getattr(method, "remote", None)
    if remote is not None:
        remote(*args)
    else:
        method(*args)
