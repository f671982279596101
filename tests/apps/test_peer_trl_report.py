"""benchmarks.peer_trl's table: every ratio and the verdict computed from the runs' figures, and seeds measured from
another SFT model refused (the figures of one seed are kept so later invocations add seeds)."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks import peer_trl

EASY = f"val-core/{peer_trl.EASY}/acc/mean@1"
HARD = f"val-core/{peer_trl.HARD}/acc/mean@1"


def _run(name: str, seed: int, step_s: list[float], startup: float, tokens: float, hit: int) -> dict:
    """A run whose adapters reach easy/hard 1.0 from step ``hit`` on (0.5 before)."""
    adapters = {k: f"{name}-s{seed}/v{k}" for k in range(1, len(step_s) + 1)}
    scores = {"base": {EASY: 0.5, HARD: 0.0}}
    scores |= {path: ({EASY: 1.0, HARD: 1.0} if k >= hit else {EASY: 1.0, HARD: 0.5}) for k, path in adapters.items()}
    run = {"wall_s": sum(step_s) + startup + 30.0, "startup_s": startup, "step_s": step_s, "train_s": sum(step_s), "tokens": tokens,
           "adapters": adapters, "seed": seed, "peak_gib": None, "setting": name}
    peer_trl.score(run, scores)
    return run


def test_ratios_and_verdict_come_from_the_figures(capsys):
    runs = {"trl": [_run("trl", s, [100.0] * 4, 100.0, 4000.0, 2) for s in (1, 2, 3)],
            "tandem": [_run("tandem", s, [40.0, 20.0, 20.0, 20.0], 80.0, 4000.0, hit) for s, hit in ((1, 2), (2, 3), (3, 2))],
            "tandem-sync": [_run("sync", s, [50.0] * 4, 80.0, 4000.0, 3) for s in (1, 2, 3)]}
    assert peer_trl.report(runs) is True  # time to target with start-up: (200 + 100) / (60 + 80) = 2.14x; tokens/s 4x
    out = capsys.readouterr().out
    assert "TRL ÷ tandem (median of seeds [1, 2, 3]): time to target (training) 3.33x, time to target (with start-up) " \
           "2.14x, trained tokens/s 4.00x, time per step 4.00x" in out
    assert "tandem-sync (median of seeds [1, 2, 3]): time to target (training) 1.33x" in out
    assert "peak memory not measured" in out
    assert out.splitlines()[-1].endswith(f"PASS ({peer_trl.GOAL})")


def test_a_run_that_never_reaches_the_target_makes_the_verdict_fail(capsys):
    runs = {"trl": [_run("trl", 1, [100.0] * 2, 100.0, 2000.0, 2)],
            "tandem": [_run("tandem", 1, [40.0] * 2, 80.0, 4000.0, 9)],  # never
            "tandem-sync": [_run("sync", 1, [50.0] * 2, 80.0, 4000.0, 2)]}
    assert peer_trl.report(runs) is False
    assert "FAIL" in capsys.readouterr().out.splitlines()[-1]


def test_a_seed_measured_from_another_sft_model_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_trl, "OUT", tmp_path)
    (tmp_path / "seed-4.json").write_text(json.dumps({"sft_sha256": "a" * 64, "runs": {}}))
    with pytest.raises(SystemExit, match="seed-4.json was measured from another SFT model"):
        peer_trl.load_seeds([4], "b" * 64)


def test_start_up_ends_when_step_one_began_not_at_process_exit(tmp_path, monkeypatch):
    """A tandem-rl run's start-up is process start until step 1 began (its row landed less its time); what the
    process does after its last step (Ray's shutdown) is in neither the start-up nor the steps."""
    monkeypatch.setattr(peer_trl, "ROOT", tmp_path)
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val-core/x": 1.0}] + [
        {"step": k, "policy_version": k, "timing/step_s": s, "tokens_per_s": 100.0, "step_time_s": s / 2}
        for k, s in ((1, 40.0), (2, 20.0))]
    written = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / "metrics.jsonl").write_text(written + '{"step": 3, "polic')
    clock = peer_trl.RowClock(run_dir / "metrics.jsonl")
    time.sleep(0.5)  # a few polls
    landed = clock.stop()
    assert sorted(landed) == [1, 2]  # the half-written third row is not a step yet
    (run_dir / "metrics.jsonl").write_text(written)
    run = peer_trl.tandem_result("r", started=1000.0, ended=1200.0, landed={1: 1100.0, 2: 1120.0})
    assert run["startup_s"] == 60.0 and run["wall_s"] == 200.0 and run["train_s"] == 60.0
    assert run["tokens"] == 100.0 * 20.0 + 100.0 * 10.0
    assert run["adapters"] == {1: str(run_dir / "adapters" / "v1"), 2: str(run_dir / "adapters" / "v2")}
