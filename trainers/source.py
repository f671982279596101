"""Where the learner gets its batches (trainers layer).

The worker loop only needs an object (in practice a Ray actor handle) with these methods:

* ``next_batch(step, policy_version) -> list[Trajectory] | None``: the trajectories of training step ``step``
  (whole groups), or None when there is no more data; ``policy_version`` is the learner's current version (staleness
  is measured against it). Only rank 0 calls it, once per step, and broadcasts.
* ``state() -> dict`` / ``load_state(state)``: optional; a data cursor saved in checkpoints and restored
  on resume. A streaming buffer whose contents do not survive a restart may omit them.

``ListTrajectorySource`` serves a fixed list of trajectories, ``groups_per_batch`` groups per step.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from agents.records import Trajectory


class TrajectorySource(Protocol):
    """What the learner pulls its batches from (module docstring): whole groups per step, None when data runs out."""

    def next_batch(self, step: int, policy_version: int | None = None) -> list[Trajectory] | None: ...


class ListTrajectorySource:
    """Whole groups in order of first appearance, ``groups_per_batch`` per step, until the list runs out."""

    def __init__(self, trajectories: Sequence[Trajectory], groups_per_batch: int):
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        groups: dict[str, list[Trajectory]] = {}
        for traj in trajectories:
            groups.setdefault(traj.group_id, []).append(traj)
        self._groups = list(groups.values())
        self._per_batch = groups_per_batch
        self._cursor = 0  # index of the next group to serve

    def next_batch(self, step: int, policy_version: int | None = None) -> list[Trajectory] | None:
        if self._cursor >= len(self._groups):
            return None
        chosen = self._groups[self._cursor : self._cursor + self._per_batch]
        self._cursor += len(chosen)
        return [traj for group in chosen for traj in group]

    def num_batches(self) -> int:
        """Batches left from the cursor on."""
        return -(-(len(self._groups) - self._cursor) // self._per_batch)

    def state(self) -> dict[str, Any]:
        return {"cursor": self._cursor}

    def load_state(self, state: dict[str, Any]) -> None:
        cursor = int(state["cursor"])
        if not 0 <= cursor <= len(self._groups):
            raise ValueError(f"source cursor {cursor} outside 0..{len(self._groups)}")
        self._cursor = cursor


def list_source_actor(trajectories: Sequence[Trajectory], groups_per_batch: int) -> Any:
    """A ``ListTrajectorySource`` as a Ray actor (no CPU reserved: it only hands out lists)."""
    import ray

    return ray.remote(num_cpus=0)(ListTrajectorySource).remote(list(trajectories), groups_per_batch)
