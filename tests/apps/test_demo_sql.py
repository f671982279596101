"""``apps.demo_sql``'s stages short of training: its config loads with the files it names, and the data stage writes
the family splits with the schema in the prompt once, then reuses them (the GRPO stage is ``apps.demo.grpo``, tested
in ``tests/apps/test_demo_stages.py``; the learning run is ``benchmarks.learning_control --task sql``)."""

from pathlib import Path

import pytest

from agents.data.rows import load_rows
from apps import demo_sql
from configs import load_config

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_data_stage_writes_the_family_splits_once_with_the_schema_in_the_prompt(tmp_path, capsys):
    cfg = load_config(str(ROOT / demo_sql.CONFIG), [f"data.train_files={tmp_path}/train.parquet",
                                                    f"data.val_files={tmp_path}/val.parquet"])
    assert cfg.actor_rollout_ref.rollout.multi_turn.format == "qwen25_coder"
    assert Path(ROOT / cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path).is_file()
    key = demo_sql.write_data(cfg, seed=3)
    first = capsys.readouterr().out
    assert "[2/3] data:" in first and "held-out-family validation questions (seed 3)" in first
    rows = load_rows(cfg.data.val_paths[0])
    groups = {r.data_source.split(":")[0] for r in rows}
    assert groups == {"sql/same_family", "sql/heldout_family"}
    assert all("\n\nTables (" in r.prompt[0].content for r in rows)
    train_families = {r.extra_info.family for r in load_rows(cfg.data.train_paths[0])}
    heldout = {r.extra_info.family for r in rows if r.data_source.startswith("sql/heldout_family")}
    assert heldout and not heldout & train_families
    assert demo_sql.write_data(cfg, seed=3) == key and "cached at" in capsys.readouterr().out
    assert demo_sql.write_data(cfg, seed=4) != key  # another seed: drawn again
