"""The sticky least-loaded routing policy, on plain replica ids."""

import pytest

from agents.records import GenerateRequest
from deployments.router import StickyLeastLoaded, trajectory_id_of

pytestmark = pytest.mark.unit


def test_turns_of_a_trajectory_stay_on_its_replica():
    policy = StickyLeastLoaded(seed=0)
    first = policy.choose("r1", "traj-a", ["x", "y"])
    policy.complete("r1")
    # Make the sticky replica the busier one: stickiness still wins over load.
    policy.choose("other-1", "traj-b", [first])
    policy.choose("other-2", "traj-c", [first])
    assert policy.choose("r2", "traj-a", ["x", "y"]) == first
    assert policy.choose("r3", "traj-a", ["x", "y"]) == first


def test_new_trajectories_alternate_between_idle_replicas():
    policy = StickyLeastLoaded(seed=0)
    chosen = [policy.choose(f"r{i}", f"traj-{i}", ["x", "y"]) for i in range(8)]
    assert sorted(chosen) == ["x"] * 4 + ["y"] * 4
    assert policy.in_flight("x") == 4 and policy.in_flight("y") == 4


def test_new_trajectory_goes_to_replica_with_fewest_in_flight():
    policy = StickyLeastLoaded(seed=0)
    policy.choose("a1", "t1", ["x"])
    policy.choose("a2", "t2", ["x"])
    policy.choose("b1", "t3", ["y"])
    assert policy.choose("new", "t4", ["x", "y"]) == "y"  # y has 1 in flight, x has 2
    policy.complete("a1")
    policy.complete("a2")
    assert policy.in_flight("x") == 0
    assert policy.choose("newer", "t5", ["x", "y"]) == "x"  # x 0, y 2


def test_ties_are_broken_by_reported_in_flight():
    policy = StickyLeastLoaded(seed=0)
    assert policy.choose("r", "t", ["x", "y"], reported_in_flight={"x": 5, "y": 1}) == "y"


def test_dead_sticky_replica_restick_elsewhere():
    policy = StickyLeastLoaded(seed=0)
    assert policy.choose("r1", "traj", ["x"]) == "x"
    policy.complete("r1")
    policy.forget_replica("x")
    assert policy.sticky_replica("traj") is None
    assert policy.choose("r2", "traj", ["y", "z"]) in ("y", "z")
    again = policy.sticky_replica("traj")
    policy.complete("r2")
    assert policy.choose("r3", "traj", ["y", "z"]) == again


def test_sticky_replica_missing_from_live_set_is_replaced():
    policy = StickyLeastLoaded(seed=0)
    policy.choose("r1", "traj", ["x"])
    policy.complete("r1")
    # Downscaled without a death notice: the live set alone decides.
    assert policy.choose("r2", "traj", ["y"]) == "y"
    assert policy.sticky_replica("traj") == "y"


def test_rechoosing_a_request_moves_its_count():
    policy = StickyLeastLoaded(seed=0)
    policy.choose("r1", "", ["x"])
    assert policy.in_flight("x") == 1
    policy.choose("r1", "", ["y"])  # same request routed again after its replica refused it
    assert policy.in_flight("x") == 0 and policy.in_flight("y") == 1
    policy.complete("r1")
    policy.complete("r1")  # a second completion of the same request is a no-op
    assert policy.in_flight("y") == 0


def test_requests_without_trajectory_are_not_stuck():
    policy = StickyLeastLoaded(seed=0)
    policy.choose("h1", "", ["x", "y"])
    assert policy.sticky_replica("") is None


def test_oldest_trajectories_are_evicted_beyond_the_bound():
    policy = StickyLeastLoaded(max_trajectories=2, seed=0)
    for i in range(3):
        policy.choose(f"r{i}", f"t{i}", ["x"])
    assert policy.sticky_replica("t0") is None
    assert policy.sticky_replica("t1") == "x" and policy.sticky_replica("t2") == "x"


def test_no_live_replica_is_an_error_naming_the_request():
    with pytest.raises(ValueError, match="req-9"):
        StickyLeastLoaded().choose("req-9", "t", [])


def test_trajectory_id_is_read_from_the_generate_request():
    request = GenerateRequest(prompt_ids=(1, 2), trajectory_id="traj-7")
    assert trajectory_id_of([request], {}) == "traj-7"
    assert trajectory_id_of([], {"request": request}) == "traj-7"
    assert trajectory_id_of(["session"], {}) == ""
    assert trajectory_id_of([], {"trajectory_id": "traj-8"}) == "traj-8"
