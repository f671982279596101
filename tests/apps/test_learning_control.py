"""benchmarks.learning_control's SQL report: each family's accuracy and the episodes' shape, before → after, for the
GRPO run and the lr=0 control, read from their validation rows."""

import pytest

from benchmarks import learning_control

pytestmark = pytest.mark.unit


def _row(step, heldout, same, parse_share):
    row = {"step": step, "val-core/sql/heldout_family/reward/mean@1": heldout,
           "val-core/sql/heldout_family:chinook_count/reward/mean@1": heldout,
           "val-core/sql/same_family/reward/mean@1": same, "val-core/sql/same_family:ins_join2/reward/mean@1": same,
           "val-aux/num_turns/mean": 2.0, "val-aux/tool_calls/mean": 1.5, "val-aux/tool_errors/mean": 0.25,
           "val-aux/parse_errors/call_share": parse_share, "val-aux/response_length/mean": 150.0}
    return row


def test_the_sql_tables_show_each_family_and_the_episode_shape_for_both_runs(monkeypatch):
    runs = {"learning-control-sql-grpo": [_row(0, 0.0, 0.1, 0.02), _row(12, 0.2, 0.5, 0.0)],
            "learning-control-sql-lr0": [_row(0, 0.0, 0.1, 0.02), _row(12, 0.0, 0.125, 0.04)]}
    monkeypatch.setattr(learning_control, "_finished", lambda name, *_: runs[name])
    lines = learning_control.sql_tables("configs/sql_cpu.yaml", [], 12).splitlines()
    assert lines[0].split()[0] == "family"
    assert lines[1].split() == ["sql/heldout_family:chinook_count", "0.000", "→", "0.200", "0.000", "→", "0.000"]
    assert lines[2].split() == ["sql/same_family:ins_join2", "0.100", "→", "0.500", "0.100", "→", "0.125"]
    assert lines[6].split()[-7:] == ["calls)", "2.0%", "→", "0.0%", "2.0%", "→", "4.0%"]
    assert len(lines) == 3 + len(learning_control.AUX)
