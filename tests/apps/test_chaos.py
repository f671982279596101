"""Faults injected into real training jobs (``benchmarks.chaos``, shortened): the learner's Ray Train worker killed
mid-run, Ctrl-C then a relaunch, and a config that over-asks the cluster. Each job is its own process with its own
local Ray cluster. (A killed rollout replica and agent worker: tests/deployments/test_routing.py,
test_generate_retry.py and tests/apps/test_coordinator_unit.py; all five in ``python -m benchmarks.chaos``.)"""

from __future__ import annotations

import json

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from benchmarks.chaos import run_fault

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("chaos_data") / "train.parquet"
    write_parquet([validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(32, seed=3, split="train"))],
                  path)
    return path


def test_killed_train_worker_restarts_from_its_checkpoint_with_versions_increasing(tmp_path, tiny_model_dir, rows):
    out = run_fault("train_worker", tmp_path, tiny_model_dir, rows, steps=4, fault_step=2)
    assert out.injected and out.codes == [0], out.output[-4000:]
    assert out.steps == 4 and out.verdict()[0], (out.versions, out.output[-4000:])
    learner = [json.loads(line) for line in (tmp_path / "train_worker" / "run" / "learner_metrics.jsonl").open()]
    assert {int(row["step"]) for row in learner} == {1, 2, 3, 4}  # every step trained (some twice when the newest
    # checkpoint is older than the last step the dead learner finished)
    assert "learner restarted from" in out.output  # the worker did restart, from a checkpoint or its initial weights
    book = json.loads((tmp_path / "train_worker" / "run" / "accounting.json").read_text())
    assert book["groups/balanced"] == 1, book


def test_ctrl_c_exits_130_and_the_relaunch_resumes(tmp_path, tiny_model_dir, rows):
    out = run_fault("sigint", tmp_path, tiny_model_dir, rows, steps=3, fault_step=1)
    assert out.codes == [130, 0] and out.checkpoint and out.resumed_from >= 1, out.output[-4000:]
    assert out.steps == 3 and out.verdict()[0]


def test_an_over_asked_cluster_fails_within_a_minute_naming_cpus(tmp_path, tiny_model_dir, rows):
    out = run_fault("over_asked", tmp_path, tiny_model_dir, rows, steps=3, fault_step=1)
    assert out.codes[0] != 0 and out.wall_s < 60, out.output[-3000:]
    assert "2.1 CPUs asked, the cluster has 2" in out.output
