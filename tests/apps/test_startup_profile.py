"""benchmarks.startup_profile's report: every process counted under its role (a Ray worker keeps the actor it was),
the roles that loaded torch marked, CPU against the cores' capacity up to when step 1 began."""

from __future__ import annotations

import pytest

from benchmarks.startup_profile import Sampler, kept_role, report, role_of

pytestmark = pytest.mark.unit


def test_roles_come_from_ray_process_titles_first_match_wins():
    assert role_of("ray::ServeReplica:app:RolloutServer.handle_request") == "rollout replica"
    assert role_of("ray::ServeReplica:app:OpenAIIngress") == "ingress"
    assert role_of("ray::TrainController.run") == "Ray Train's actors"
    assert role_of("ray::AgentWorkerImpl.run_rows") == "agent workers"
    assert role_of("ray::IDLE") == "idle Ray workers"
    # a worker before `import ray` has set its title: not a Ray daemon, though its path holds /ray/
    assert role_of("/venv/bin/python /venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py "
                   "--session-dir=/tmp/ray/session_1") == "idle Ray workers"
    assert role_of("ray::SomethingNew") == "other Ray workers"
    assert role_of("/venv/bin/python -m apps.train --config configs/demo_cpu.yaml") == "driver"
    assert role_of("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x") == "Ray daemons"
    assert role_of("sshd: root") == "other"


def test_report_sums_cpu_by_role_and_marks_torch():
    sample = {1: ("driver", 12.0, True), 2: ("tandem-rl's actors", 2.0, False), 3: ("tandem-rl's actors", 1.5, False),
              4: ("ingress", 9.0, True), 5: ("Ray daemons", 0.2, False)}
    lines = report(50.0, {"Serve started": 20.0, "Ray's first daemon": 8.0}, sample, cores=2)
    assert lines[0] == "timeline: Ray's first daemon 8.0s, Serve started 20.0s, step 1 began 50.0s"
    assert ("cpu until step 1 began: 25s of 100s (2 cores x 50s), 4 processes: driver 12.0s (torch), ingress 9.0s "
            "(torch), tandem-rl's actors 3.5s") == lines[1]  # a role under 0.5 s is left out
    assert lines[2] == "startup_profile: step 1 began 50.0s after launch; 25 CPU-seconds by then (25% of the cores)"


def test_a_worker_keeps_the_role_it_had_and_the_sampler_answers_the_last_sample_before_a_time():
    assert kept_role("idle Ray workers", "agent workers") == "agent workers"  # an IDLE worker becomes an actor
    assert kept_role("agent workers", "idle Ray workers") == "agent workers"  # and back: it stays what it was
    assert kept_role("idle Ray workers", "idle Ray workers") == "idle Ray workers"
    sampler = Sampler.__new__(Sampler)
    sampler.samples = [(1.0, {7: ("idle Ray workers", 0.5, False)}), (2.0, {7: ("agent workers", 3.0, True)}),
                       (3.0, {7: ("agent workers", 4.0, True)})]
    assert sampler.at(2.5) == {7: ("agent workers", 3.0, True)}
    assert sampler.at(0.5) == {}
