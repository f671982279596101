"""Sticky, least-loaded request routing for ``RolloutServer`` (deployments layer).

All turns of one ``trajectory_id`` go to the replica that served its first turn while that replica is
alive, so the replica's prefix/KV cache can be reused; a new trajectory goes to the replica with the
fewest requests in flight from this handle (ties: fewest in flight as the replica last reported through
``record_routing_stats``, then random). When the sticky replica is gone the next turn picks a new one and
re-sticks there.

``StickyLeastLoaded`` is the pure policy (plain replica-id strings, unit-tested); ``StickyRouter`` adapts
it to Ray Serve 2.60's ``RequestRouter`` interface. The router sees each request's resolved arguments
(``PendingRequest.args``/``kwargs``), so the trajectory id is read straight from the ``GenerateRequest``;
calls without one (health checks, ``load_adapter``) are routed least-loaded and not stuck anywhere.

In-flight counts are this handle's own (every agent worker has its own handle and router): each router
balances its share, which keeps the sum balanced too.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from typing import Any, Mapping, Sequence

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from agents.records import GenerateRequest

# Sticky entries kept per handle; the oldest are dropped first (finished trajectories are never reused).
MAX_STICKY_TRAJECTORIES = 200_000


class StickyLeastLoaded:
    """Trajectory → replica table plus in-flight counts per replica, keyed by plain string ids."""

    def __init__(self, max_trajectories: int = MAX_STICKY_TRAJECTORIES, seed: int | None = None) -> None:
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._max_trajectories = max_trajectories
        self._assigned: dict[str, str] = {}  # request id → replica id, until the request completes
        self._load: Counter[str] = Counter()
        self._rng = random.Random(seed)

    def choose(
        self,
        request_id: str,
        trajectory_id: str,
        live: Sequence[str],
        reported_in_flight: Mapping[str, int] | None = None,
    ) -> str:
        """The replica for this request; counts it as in flight there until ``complete(request_id)``."""
        if not live:
            raise ValueError(f"request {request_id!r}: no live replicas to choose from")
        # A request is re-chosen when its first choice could not take it (full queue, replica died).
        self.complete(request_id)
        replica = self._sticky.get(trajectory_id) if trajectory_id else None
        if replica in live:
            self._sticky.move_to_end(trajectory_id)
        else:
            replica = self._least_loaded(live, reported_in_flight or {})
            if trajectory_id:
                self._stick(trajectory_id, replica)
        self._assigned[request_id] = replica
        self._load[replica] += 1
        return replica

    def complete(self, request_id: str) -> None:
        replica = self._assigned.pop(request_id, None)
        if replica is not None:
            self._load[replica] -= 1
            if self._load[replica] <= 0:
                del self._load[replica]

    def forget_replica(self, replica_id: str) -> None:
        """A replica died: its trajectories re-stick on their next turn."""
        for trajectory_id in [t for t, r in self._sticky.items() if r == replica_id]:
            del self._sticky[trajectory_id]

    def in_flight(self, replica_id: str) -> int:
        return self._load.get(replica_id, 0)

    def sticky_replica(self, trajectory_id: str) -> str | None:
        return self._sticky.get(trajectory_id)

    def _least_loaded(self, live: Sequence[str], reported: Mapping[str, int]) -> str:
        def key(replica: str) -> tuple[int, int]:
            return (self._load.get(replica, 0), reported.get(replica, 0))

        best = min(key(r) for r in live)
        return self._rng.choice([r for r in live if key(r) == best])

    def _stick(self, trajectory_id: str, replica: str) -> None:
        self._sticky[trajectory_id] = replica
        self._sticky.move_to_end(trajectory_id)
        while len(self._sticky) > self._max_trajectories:
            self._sticky.popitem(last=False)


def trajectory_id_of(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The ``trajectory_id`` of the call's ``GenerateRequest`` argument, or of a ``trajectory_id=`` keyword.

    The keyword lets other methods (``replica_stats``) reach the replica a trajectory is stuck to.
    """
    for value in (*args, *kwargs.values()):
        if isinstance(value, GenerateRequest):
            return value.trajectory_id
    keyword = kwargs.get("trajectory_id", "")
    return keyword if isinstance(keyword, str) else ""


class StickyRouter(RequestRouter):
    """Ray Serve request router applying ``StickyLeastLoaded`` to ``RolloutServer`` replicas."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policy = StickyLeastLoaded()

    def initialize_state(self, max_trajectories: int = MAX_STICKY_TRAJECTORIES, **kwargs: Any) -> None:
        self.policy = StickyLeastLoaded(max_trajectories=max_trajectories)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        reported = {
            rid: int(r.routing_stats.get("in_flight", 0)) for rid, r in by_id.items() if r.routing_stats
        }
        request_id = pending_request.metadata.internal_request_id
        chosen = self.policy.choose(
            request_id, trajectory_id_of(pending_request.args, pending_request.kwargs), list(by_id), reported
        )
        # A request cancelled before it is sent never reaches on_request_completed: uncount it here.
        pending_request.future.add_done_callback(
            lambda future: self.policy.complete(request_id) if future.cancelled() else None
        )
        # One replica only: a sticky trajectory waits for its replica rather than spilling over.
        return [[by_id[chosen]]]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self.policy.complete(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.forget_replica(replica_id.unique_id)
