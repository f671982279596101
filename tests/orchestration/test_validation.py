"""Validation metrics and dumps match verl's own code for the same inputs (verl's trainer methods are called
unbound: they do not use the trainer's state)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.records import ScoredSample
from orchestration.validation import core_accuracy, dump_generations, pick_generations, validation_metrics

pytestmark = pytest.mark.unit


def _samples() -> list[ScoredSample]:
    out = []
    for row in range(6):
        source = "tandem/arithmetic/easy" if row % 2 else "tandem/arithmetic/hard"
        for k in range(3):
            acc = float((row + k) % 3 == 0)
            out.append(ScoredSample(data_source=source, uid=f"val-r{row}", input=f"q{row}", output=f"a{row}-{k}",
                                    score=acc, ground_truth=str(row), reward_extra={"acc": acc, "len": float(k)},
                                    num_turns=1 + k))
    return out


def test_metric_names_and_values_equal_verls_for_the_same_inputs():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    samples = _samples()
    infos = {"reward": [s.score for s in samples], "acc": [s.reward_extra["acc"] for s in samples],
             "len": [s.reward_extra["len"] for s in samples]}
    expected = RayPPOTrainer._val_metrics_update(
        None, np.array([s.data_source for s in samples]), [s.uid for s in samples], infos,
        [np.array([s.num_turns for s in samples])])
    ours = validation_metrics(samples)
    assert set(expected) <= set(ours)
    # beside verl's names, only the agent's own episode figures (tests below)
    assert {k.split("/")[1] for k in set(ours) - set(expected)} == {"tool_calls", "tool_errors", "parse_errors",
                                                                    "response_length"}
    assert all(ours[k] == pytest.approx(float(expected[k])) for k in expected)
    assert "val-core/tandem/arithmetic/hard/acc/mean@3" in ours and "val-aux/tandem/arithmetic/hard/reward/mean@3" in ours
    assert core_accuracy(ours) == {"tandem/arithmetic/easy": ours["val-core/tandem/arithmetic/easy/acc/mean@3"],
                                   "tandem/arithmetic/hard": ours["val-core/tandem/arithmetic/hard/acc/mean@3"]}


def test_episode_figures_tool_errors_parse_failures_length_and_why_episodes_ended():
    samples = [ScoredSample("sql/x", "u0", "q", "a", 1.0, num_tool_calls=2, num_tool_errors=1, response_length=30,
                            termination="answered"),
               ScoredSample("sql/x", "u1", "q", "a", 0.0, num_tool_calls=1, num_parse_errors=1, response_length=50,
                            termination="response_budget"),
               ScoredSample("sql/x", "u2", "q", "a", 0.0, num_tool_calls=1, num_parse_errors=2, response_length=40,
                            termination="response_budget"),
               ScoredSample("sql/x", "u3", "q", "a", 1.0, response_length=20, termination="answered")]
    m = validation_metrics(samples)
    assert m["val-aux/tool_calls/mean"] == 1.0 and m["val-aux/tool_errors/mean"] == 0.25
    assert m["val-aux/parse_errors/mean"] == 0.75 and m["val-aux/parse_errors/episode_share"] == 0.5
    assert m["val-aux/parse_errors/call_share"] == pytest.approx(3 / 7)  # 3 unreadable of 4 run + 3 unreadable
    assert m["val-aux/response_length/mean"] == 35.0
    assert m["val-aux/termination/answered"] == 0.5 and m["val-aux/termination/response_budget"] == 0.5


def test_without_acc_the_core_metric_is_the_reward():
    samples = [ScoredSample("gsm8k", f"u{i}", "q", "a", float(i % 2)) for i in range(4)]
    metrics = validation_metrics(samples)
    assert metrics["val-core/gsm8k/reward/mean@1"] == 0.5
    with pytest.raises(ValueError, match="'acc' is missing"):
        validation_metrics([ScoredSample("x", "u0", "q", "a", 1.0, reward_extra={"acc": 1.0}),
                            ScoredSample("x", "u1", "q", "a", 1.0)])


def test_a_failed_episode_scores_0_on_every_reward_key_and_is_counted():
    metrics = validation_metrics([ScoredSample("x", "u0", "q", "a", 1.0, reward_extra={"acc": 1.0}),
                                  ScoredSample("x", "u1", "", "[episode failed: ReadTimeout]", 0.0, termination="failed")])
    assert metrics["val-core/x/acc/mean@1"] == 0.5 and metrics["val-aux/termination/failed"] == 0.5


def test_dump_file_format_equals_verls(tmp_path: Path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    samples = _samples()
    ours = dump_generations(samples, 7, tmp_path / "ours", validation=True)
    infos = {"reward": [s.score for s in samples], "acc": [s.reward_extra["acc"] for s in samples],
             "len": [s.reward_extra["len"] for s in samples]}
    RayPPOTrainer._write_generations([s.input for s in samples], [s.output for s in samples],
                                     [s.ground_truth for s in samples], [s.score for s in samples], infos,
                                     str(tmp_path / "verl"), 7)
    assert ours == tmp_path / "ours" / "7.jsonl"
    ours_rows = [json.loads(line) for line in ours.read_text().splitlines()]
    verl_rows = [json.loads(line) for line in (tmp_path / "verl" / "7.jsonl").read_text().splitlines()]
    assert ours_rows == verl_rows
    assert set(ours_rows[0]) == {"input", "output", "gts", "score", "step", "reward", "acc", "len"}


def test_logged_generations_are_verls_choice():
    samples = _samples()
    rows = sorted(((s.input, s.output, s.score) for s in samples), key=lambda x: x[0])
    np.random.RandomState(42).shuffle(rows)
    assert pick_generations(samples, 4) == rows[:4]
    assert pick_generations(samples, 0) == []
