"""GSM8K reward through verl's scorer, loaded without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from agents.rewards.gsm8k import normalize_ground_truth, score


@pytest.mark.unit
@pytest.mark.parametrize(
    "solution,ground_truth,expected",
    [
        ("48 / 2 = 24, 48 + 24 = 72\n#### 72", "72", 1.0),
        ("#### 1,200", "1200", 1.0),  # strict strips thousands separators
        ("#### 71", "72", 0.0),
        ("the answer is 72", "72", 0.0),  # strict needs '#### '
        ("#### 72", "#### 72", 1.0),  # raw GSM8K answer field as ground truth
        ("#### 3", 3, 1.0),
    ],
)
def test_strict(solution, ground_truth, expected):
    assert score(solution, ground_truth) == expected


@pytest.mark.unit
def test_flexible_takes_last_number_and_format_score():
    assert score("first 10 then 72 apples", "72", method="flexible") == 1.0
    assert score("first 10 then 72.", "72", method="flexible") == 0.0  # verl keeps the trailing '.'

    assert score("#### 71", "72", format_score=0.1) == 0.1
    assert score("no number", "72", format_score=0.1) == 0.0


@pytest.mark.unit
def test_normalize_ground_truth():
    assert normalize_ground_truth("She pays 3 * 400 = 1,200\n#### 1,200") == "1200"
    assert normalize_ground_truth(" $5 ") == "5"


@pytest.mark.unit
def test_import_does_not_pull_torch_or_ray():
    code = "import sys, agents.rewards, agents.tools.registry; print(sorted({'torch', 'ray', 'verl'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
