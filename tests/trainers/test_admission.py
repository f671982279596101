"""AdmissionController: AReaL's capacity rule, publishes free capacity, failed and dropped groups give their slots
back and are counted, aborting (abort_stale only), nothing admitted beyond the bound."""

import random

import pytest

from trainers.admission import AdmissionController

pytestmark = pytest.mark.unit


def test_capacity_rule_and_a_publish_that_frees_capacity():
    ctl = AdmissionController(batch_groups=2, max_staleness=1)
    first = ctl.admit(10)
    assert len(first) == 4 and {t.version for t in first} == {0}  # (0 + 1 + 1) × 2
    assert ctl.admit(10) == []
    for ticket in first:
        assert ctl.finished(ticket.id)
    assert ctl.admit(10) == []  # finishing frees nothing: the learner has not trained them yet
    assert ctl.on_publish(1) == []
    second = ctl.admit(10)
    assert [t.version for t in second] == [1, 1]  # (1 + 1 + 1) × 2 − 4
    assert [t.id for t in second] == [4, 5]
    assert ctl.on_publish(0) == [] and ctl.version == 1  # versions never go back


def test_failed_group_gives_its_slot_back_and_is_counted():
    ctl = AdmissionController(batch_groups=2, max_staleness=0)
    a, b = ctl.admit(5)
    assert ctl.failed(b.id)
    (c,) = ctl.admit(5)  # the learner still needs a full batch
    assert c.id == 2
    assert ctl.finished(a.id) and ctl.finished(c.id)
    stats = ctl.stats()
    assert (stats["groups/admitted"], stats["groups/failed"], stats["groups/in_flight"]) == (3, 1, 0)
    with pytest.raises(KeyError, match="ticket 9 was never admitted"):
        ctl.finished(9)


def test_synchronous_mode_admits_one_batch_per_published_version():
    ctl = AdmissionController(batch_groups=3, max_staleness=4, streaming=False)
    assert len(ctl.admit(10)) == 3
    assert ctl.admit(10) == []
    ctl.on_publish(1)
    assert len(ctl.admit(10)) == 3


def test_default_never_aborts_and_abort_stale_aborts_what_started_too_long_ago():
    keep = AdmissionController(batch_groups=1, max_staleness=0)
    (t,) = keep.admit(1)
    assert keep.on_publish(5) == [] and keep.in_flight == 1  # it finishes and is trained, however long it takes
    abort = AdmissionController(batch_groups=1, max_staleness=1, abort_stale=True)
    old = abort.admit(2)
    abort.on_publish(1)
    assert abort.on_publish(2) == old  # started at 0 < 2 − 1
    assert abort.in_flight == 0 and abort.stats()["groups/aborted_in_flight"] == 2
    assert abort.finished(old[0].id) is False  # its late end changes nothing
    assert len(abort.admit(10)) == 4  # (2 + 1 + 1) × 1, both aborted slots back


def test_dropped_groups_give_slots_back_but_never_more_than_finished():
    ctl = AdmissionController(batch_groups=1, max_staleness=0, abort_stale=True)
    (t,) = ctl.admit(1)
    with pytest.raises(ValueError, match="only 0 groups finished"):
        ctl.dropped(1)
    ctl.finished(t.id)
    ctl.dropped(1)
    assert len(ctl.admit(1)) == 1


@pytest.mark.parametrize("seed", range(5))
def test_nothing_is_admitted_beyond_the_bound(seed):
    """Random admits, finishes, failures and publishes: started − returned slots never exceeds the bound, and
    every ticket is in exactly one bucket."""
    rng = random.Random(seed)
    ctl = AdmissionController(batch_groups=3, max_staleness=2)
    open_tickets = []
    for _ in range(500):
        op = rng.random()
        if op < 0.4:
            open_tickets += ctl.admit(rng.randint(0, 5))
        elif op < 0.7 and open_tickets:
            ctl.finished(open_tickets.pop(rng.randrange(len(open_tickets))).id)
        elif op < 0.8 and open_tickets:
            ctl.failed(open_tickets.pop(rng.randrange(len(open_tickets))).id)
        elif op < 0.9:
            ctl.on_publish(ctl.version + 1)
        assert ctl.used <= (ctl.version + 3) * 3
        assert all(t.version <= ctl.version for t in open_tickets)
        assert ctl.admitted == ctl.finished_count + ctl.failed_count + ctl.in_flight


def test_accounting_fails_when_a_bucket_is_miscounted():
    from orchestration.coordinator import accounting

    admission = {"groups/admitted": 7, "groups/aborted_in_flight": 1, "groups/failed": 1, "groups/in_flight": 2}
    buffer = {"groups/trained": 2, "groups/dropped_stale": 0, "buffer/depth": 1}
    assert accounting(admission, buffer)["groups/balanced"] == 1
    assert accounting(admission, {**buffer, "buffer/depth": 0})["groups/balanced"] == 0  # a group went missing
    assert accounting({**admission, "groups/in_flight": 3}, buffer)["groups/balanced"] == 0


def test_a_resumed_run_admits_nothing_until_the_restored_version_is_published():
    """A relaunch from the step-3 checkpoint: the replicas sample version 0 until the learner republishes 3; the
    bound then counts from 3 (groups trained before the relaunch are not this launch's)."""
    admission = AdmissionController(2, 1, resume_version=3)
    assert admission.admit(10) == [] and admission.limit == 0
    admission.on_publish(3)
    tickets = admission.admit(10)
    assert len(tickets) == (1 + 1) * 2 and {t.version for t in tickets} == {3}
    admission.on_publish(4)
    assert len(admission.admit(10)) == 2


def test_nothing_is_started_beyond_the_groups_the_learner_will_train_and_a_repeated_step_adds_a_batch():
    ctl = AdmissionController(batch_groups=2, max_staleness=1, total_groups=6)  # 3 steps of 2 groups
    first = ctl.admit(10)
    assert len(first) == 4
    for ticket in first:
        ctl.finished(ticket.id)
    ctl.on_publish(1)
    assert len(ctl.admit(10)) == 2  # the bound says 6, the run's total 6
    ctl.on_publish(2)
    assert ctl.admit(10) == [] and ctl.stats()["admission/limit"] == 6  # the bound says 8: no step 4 to train
    ctl.learner_repeats(1)  # restarted from a checkpoint, the learner asks for a step's batch again
    again = ctl.admit(10)
    assert len(again) == 2 and ctl.total_groups == 8
    assert ctl.failed(again[0].id) and len(ctl.admit(10)) == 1  # a failed group's slot still goes back
    with pytest.raises(ValueError, match="at least one step"):
        ctl.learner_repeats(0)
    with pytest.raises(ValueError, match="total_groups=-2"):
        AdmissionController(batch_groups=2, max_staleness=0, total_groups=-2)
    unbounded = AdmissionController(batch_groups=2, max_staleness=0)
    unbounded.learner_repeats(3)  # no end to raise
    assert unbounded.total_groups is None and len(unbounded.admit(10)) == 2
