"""What a three-step ``apps.train`` run in the tests must leave behind (tests/apps/test_train.py, test_ray_job.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

REQUIRED = ("step", "reward/mean", "policy_version", "staleness/mean", "timing/step_s", "response_length/mean",
            "tool_calls/mean", "tool_parse_errors/sum")


def check_run(run_dir: Path, db: Path) -> list[dict]:
    """The three training steps' metrics rows (a step-0 row, validation before training, is left out)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lines = [row for row in lines if int(row["step"]) > 0]
    assert [int(row["step"]) for row in lines] == [1, 2, 3]
    for row in lines:
        missing = [key for key in REQUIRED if key not in row]
        assert not missing, f"step {row['step']} lacks {missing}"
    assert [int(row["policy_version"]) for row in lines] == [1, 2, 3]
    last = lines[-1]
    assert last["groups/trained"] == 3 * 2
    # Every admitted group is accounted for, each bucket counted on its own side (not as a remainder).
    book = json.loads((run_dir / "accounting.json").read_text())
    assert book["groups/balanced"] == 1, book
    assert book["groups/admitted"] == sum(book[k] for k in ("groups/trained", "groups/dropped_stale",
                                                            "groups/aborted_in_flight", "groups/failed",
                                                            "groups/left_over"))
    assert book["groups/trained"] == 3 * 2 and book["groups/admitted"] >= 6
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "adapters" / "v3" / "adapter_model.safetensors").is_file()
    with sqlite3.connect(db) as conn:
        names = {name for (name,) in conn.execute("select distinct key from metrics")}
    assert "reward/mean" in names and "timing/step_s" in names
    return lines
