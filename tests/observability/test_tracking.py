"""RunTracker's sinks: metrics.jsonl (``file``) and tensorboard event files, read back; a non-finite value (a
diverging run) is kept, not dropped."""

from __future__ import annotations

import json
import math

import pytest

from observability.tracking import RunTracker
from configs import load_config

pytestmark = pytest.mark.unit


def test_tensorboard_and_file_loggers_hold_every_step_nan_included(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    cfg = load_config(None, ["trainer.logger=[tensorboard,file]"])
    tracker = RunTracker(cfg, tmp_path / "run", ray_metrics=False)
    tracker.log_step(1, {"reward/mean": 0.25, "grad_norm": 1.5})
    tracker.log_step(2, {"reward/mean": 0.5, "grad_norm": float("nan")})
    tracker.finish()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/mean"] for r in rows] == [0.25, 0.5] and math.isnan(rows[1]["grad_norm"])
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]
    assert math.isnan(events.Scalars("grad_norm")[1].value)
    assert tracker.mlflow_run_id is None  # mlflow not asked for


def test_a_store_prepared_ahead_has_tables_but_no_run_until_the_tracker_starts_one(tmp_path, monkeypatch):
    import sqlite3

    import mlflow

    from observability import tracking

    monkeypatch.chdir(tmp_path)  # mlflow's default artifact root (./mlruns) lands here
    db = tmp_path / "mlruns.db"
    cfg = load_config(None, [f"tracking.mlflow_tracking_uri=sqlite:///{db}", "trainer.logger=[mlflow]",
                             "trainer.experiment_name=prepared"])
    tracking.prepare_store(cfg)
    thread = tracking._PREPARING[cfg.tracking.mlflow_tracking_uri]
    thread.join(120)
    with sqlite3.connect(db) as conn:  # what a run refused now would leave: tables, no run
        assert conn.execute("select count(*) from runs").fetchone() == (0,)
    tracker = RunTracker(cfg, tmp_path / "run", ray_metrics=False)
    assert cfg.tracking.mlflow_tracking_uri not in tracking._PREPARING  # waited for, then forgotten
    tracker.log_step(1, {"reward/mean": 0.5})
    tracker.finish()
    run = mlflow.MlflowClient(tracking_uri=cfg.tracking.mlflow_tracking_uri).get_run(tracker.mlflow_run_id)
    assert run.info.run_name == "prepared" and run.data.metrics["reward/mean"] == 0.5


def test_a_step_redone_after_a_learner_restart_replaces_its_row(tmp_path):
    cfg = load_config(None, ["trainer.logger=[file]"])
    tracker = RunTracker(cfg, tmp_path / "run", ray_metrics=False)
    tracker.log_step(0, {"val-core/x/acc/mean@1": 0.1})  # validation rows have no policy version: never replaced
    for step, version in ((1, 1), (2, 2), (3, 3), (4, 4)):
        tracker.log_step(step, {"policy_version": version, "reward/mean": step / 10})
    tracker.log_step(4, {"val-core/x/acc/mean@1": 0.4})
    tracker.log_step(3, {"policy_version": 5, "reward/mean": 0.33})  # restored from the step-2 checkpoint
    tracker.log_step(4, {"policy_version": 6, "reward/mean": 0.44})
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["policy_version"], r.get("redone", 0)) for r in rows if "policy_version" in r]
    assert train == [(1, 1, 0), (2, 2, 0), (3, 5, 1), (4, 6, 0)]
    assert [r["step"] for r in rows if "val-core/x/acc/mean@1" in r] == [0, 4]
    assert [r["step"] for r in tracker.history if "policy_version" in r] == [1, 2, 3, 4]


def test_a_step_checkpointed_but_not_logged_before_a_stop_is_recovered_from_the_learners_line(tmp_path):
    cfg = load_config(None, ["trainer.logger=[file]"])
    first = RunTracker(cfg, tmp_path / "run", ray_metrics=False)
    first.log_step(0, {"val-core/x/acc/mean@1": 0.1})
    for step in (1, 2, 3):
        first.log_step(step, {"policy_version": step, "reward/mean": step / 10, "timing/rollout_s": 1.0})
    # SIGTERM after the learner finished and checkpointed step 4, before step 4's row was logged; the relaunch
    # resumes from the step-4 checkpoint
    learner = [{"step": s, "policy_version": s, "reward/mean": s / 10, "note": "text"} for s in (1, 2, 3, 4)]
    relaunch = RunTracker(cfg, tmp_path / "run", ray_metrics=False)
    assert relaunch.recover_steps(learner, upto=4) == [4]
    assert relaunch.recover_steps(learner, upto=4) == []  # once
    relaunch.log_step(5, {"policy_version": 5, "reward/mean": 0.5})
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("recovered", 0)) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 0)]
    assert rows[4]["reward/mean"] == 0.4 and "note" not in rows[4] and "timing/rollout_s" in rows[3]
    assert [r["step"] for r in relaunch.history] == [0, 1, 2, 3, 4, 5]
