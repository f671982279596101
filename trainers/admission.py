"""Admission control for streaming RL: how many prompt groups may be generating, and which to give up on
(trainers layer; a pure class, no Ray, no asyncio).

The staleness bound applies when a group is *admitted* (AReaL's rule, ``areal/infra/staleness_manager.py``):
at published policy version ``v`` at most ``(v + max_staleness + 1) × batch_groups`` groups have ever been
started, not counting groups that failed or were dropped (their slots go back: the learner still needs full
batches). A group admitted at version ``u`` therefore starts at most ``max_staleness`` versions behind the
learner that will train it, in steady state. Once admitted a group always finishes and is trained (its
tokens keep the version and log-prob they were sampled with; the learner corrects with them), so long
episodes are trained as often as they are generated. ``abort_stale`` keeps the older behaviour for
comparison: a publish aborts the in-flight groups that started more than ``max_staleness`` versions ago.

The run's end bounds admission too (``total_groups``): no more groups are started than the learner will train,
so the last steps' generation does not compete with training for groups nobody trains (nor delay the run's
shutdown). A learner that Ray Train restarted from a checkpoint asks for the steps after it again; the buffer
tells of each repeated step (``learner_repeats``), which raises the total by one batch.

Batch-synchronous mode (``streaming=False``): the groups of step ``v + 1`` are admitted only once version
``v`` is published, ``(v + 1) × batch_groups`` in all.

The owner (the coordinator) calls ``admit`` to start groups, ``finished`` / ``failed`` when a group's call
returns, ``dropped`` for groups the queue discarded, and ``on_publish`` when the learner publishes (a push
from the publisher). Every ticket ends in exactly one of: finished (then queued or trained), failed, aborted,
or still in flight.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ticket:
    """One admitted group: its sequence number and the published version when it was admitted."""

    id: int
    version: int


class AdmissionController:
    """The admission rule (module docstring): the coordinator asks it for tickets and tells it how each group ends."""

    def __init__(self, batch_groups: int, max_staleness: int, *, streaming: bool = True, abort_stale: bool = False,
                 resume_version: int = 0, total_groups: int | None = None):
        if batch_groups < 1 or max_staleness < 0:
            raise ValueError(f"batch_groups={batch_groups} must be >= 1 and max_staleness={max_staleness} >= 0")
        if total_groups is not None and total_groups < 0:
            raise ValueError(f"total_groups={total_groups} must be >= 0 (None: no end)")
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness if streaming else 0
        self.streaming = streaming
        self.abort_stale = abort_stale and streaming
        # A resumed run starts at the restored checkpoint's version: nothing is admitted until the learner has
        # published it (the replicas would sample the base model), and the bound counts from there.
        self.base_version = resume_version
        self.version = resume_version
        self.ready = resume_version == 0
        self._in_flight: dict[int, Ticket] = {}
        self.admitted = 0
        self.finished_count = 0
        self.failed_count = 0
        self.aborted_count = 0  # in flight when a publish made them too stale (abort_stale only)
        self.dropped_count = 0  # finished, then discarded by the queue (abort_stale only)
        # groups the learner will train from this launch on (None: no end); repeated steps raise it
        self.total_groups = total_groups

    @property
    def limit(self) -> int:
        """Groups that may have been started, net of returned slots, at the current version."""
        if not self.ready:
            return 0
        ahead = self.max_staleness + 1 if self.streaming else 1
        bound = (self.version - self.base_version + ahead) * self.batch_groups
        return bound if self.total_groups is None else min(bound, self.total_groups)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def used(self) -> int:
        return self.admitted - self.failed_count - self.aborted_count - self.dropped_count

    def room(self) -> int:
        return max(0, self.limit - self.used)

    def admit(self, wanted: int) -> list[Ticket]:
        """Up to ``wanted`` tickets, within the bound (none while it is reached)."""
        tickets = [Ticket(self.admitted + k, self.version) for k in range(max(0, min(wanted, self.room())))]
        for ticket in tickets:
            self._in_flight[ticket.id] = ticket
        self.admitted += len(tickets)
        return tickets

    def on_publish(self, version: int) -> list[Ticket]:
        """The learner published ``version``. Returns the in-flight tickets to abort (``abort_stale`` only:
        started below ``version - max_staleness``); their slots are back already."""
        self.version = max(self.version, version)
        self.ready = self.ready or version >= self.base_version
        if not self.abort_stale:
            return []
        oldest = self.version - self.max_staleness
        doomed = [t for t in self._in_flight.values() if t.version < oldest]
        for ticket in doomed:
            del self._in_flight[ticket.id]
        self.aborted_count += len(doomed)
        return doomed

    def learner_repeats(self, steps: int = 1) -> None:
        """A restarted learner trains ``steps`` steps again: each needs one more batch than the run's total."""
        if steps < 1:
            raise ValueError(f"learner_repeats({steps}): a repeat is at least one step")
        if self.total_groups is not None:
            self.total_groups += steps * self.batch_groups

    def _take(self, ticket_id: int, what: str) -> Ticket | None:
        ticket = self._in_flight.pop(ticket_id, None)
        if ticket is None and ticket_id >= self.admitted:
            raise KeyError(f"{what}: ticket {ticket_id} was never admitted")
        return ticket  # None: aborted earlier, its late end changes nothing

    def finished(self, ticket_id: int) -> bool:
        """The group reached the queue. False when it had been aborted (the queue will not train it)."""
        if self._take(ticket_id, "finished") is None:
            return False
        self.finished_count += 1
        return True

    def failed(self, ticket_id: int) -> bool:
        """The group failed: counted, and its slot goes back. False when it had been aborted."""
        if self._take(ticket_id, "failed") is None:
            return False
        self.failed_count += 1
        return True

    def dropped(self, count: int) -> None:
        """``count`` finished groups were discarded by the queue as too stale: their slots go back."""
        if count < 0 or count > self.finished_count - self.dropped_count:
            raise ValueError(f"dropped({count}): only {self.finished_count - self.dropped_count} groups finished")
        self.dropped_count += count

    def stats(self) -> dict[str, float]:
        return {
            "groups/admitted": float(self.admitted),
            "groups/in_flight": float(self.in_flight),
            "groups/failed": float(self.failed_count),
            "groups/aborted_in_flight": float(self.aborted_count),
            "admission/limit": float(self.limit),
            "admission/version": float(self.version),
        }
