"""Faults injected into real training jobs (``benchmarks.chaos``, shortened): the learner's Ray Train worker killed
mid-run, then Ctrl-C and a relaunch (both in one job), and a config that over-asks the cluster. Each job is its own
process with its own local Ray cluster. (A killed rollout replica and agent worker: tests/deployments/test_routing.py,
test_generate_retry.py and tests/orchestration/test_coordinator_unit.py; all five in ``python -m benchmarks.chaos``.)"""

from __future__ import annotations

import json

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from benchmarks.chaos import run_fault, run_faults

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("chaos_data") / "train.parquet"
    write_parquet([validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(32, seed=3, split="train"))],
                  path)
    return path


def test_killed_train_worker_restarts_from_its_checkpoint_then_sigterm_exits_143_and_the_relaunch_resumes(
        tmp_path, tiny_model_dir, rows):
    # One job, two faults (a job start costs ~1.5 min): the Ray Train worker killed after step 2, SIGTERM (what `ray job
    # stop` and a pod's shutdown send) after step 3, of 6 (a learner with groups waiting trains a step in well under a
    # second: the relaunch must have steps left). Ctrl-C takes the same path (KeyboardInterrupt, exit 130):
    # `python -m benchmarks.chaos --only sigint` runs it.
    out = run_faults([("train_worker", 2), ("sigterm", 3)], tmp_path, tiny_model_dir, rows, steps=6)
    assert out.injected and out.codes == [143, 0], out.output[-4000:]
    assert "SIGTERM received" not in out.output  # Ray's failure-signal handler (stack dump, exit 134) did not run it
    assert out.checkpoint and out.resumed_from >= 1, out.output[-4000:]
    assert out.steps == 6 and out.verdict()[0], (out.versions, out.verdict()[1], out.output[-4000:])
    run_dir = tmp_path / "train_worker+sigterm" / "run"
    learner = [json.loads(line) for line in (run_dir / "learner_metrics.jsonl").open()]
    assert {int(row["step"]) for row in learner} == {1, 2, 3, 4, 5, 6}  # every step trained (some twice when the newest
    # checkpoint is older than the last step the dead learner finished, or than the step Ctrl-C stopped)
    assert "learner restarted from" in out.output  # the worker did restart, from a checkpoint or its initial weights
    book = json.loads((run_dir / "accounting.json").read_text())
    assert book["groups/balanced"] == 1, book
    # one metrics row per step, though the restarted learner and the relaunch redid some
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [int(r["step"]) for r in rows if "policy_version" in r] == [1, 2, 3, 4, 5, 6], rows


def test_an_over_asked_cluster_is_refused_before_anything_starts_naming_cpus(tmp_path, tiny_model_dir, rows):
    # Refused by the resource check before anything starts (exit code 2, cli's user-error code), not left waiting for
    # CPUs Ray would never grant: such a run would be killed at the 300 s limit with another code. No wall-time bound
    # (the refusal took 37 s on an idle box and 63 s beside the other xdist worker).
    out = run_fault("over_asked", tmp_path, tiny_model_dir, rows, steps=3, fault_step=1, timeout_s=300.0)
    assert out.codes == [2] and out.steps == 0, out.output[-3000:]
    assert "2.1 CPUs asked, the cluster has 2" in out.output
