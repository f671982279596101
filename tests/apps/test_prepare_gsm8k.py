"""prepare_gsm8k CLI: offline reasoning-gym rows, a local GSM8K file, errors naming file and row."""

import json

import pytest

from agents.data.rows import DataError, load_rows
from apps.prepare_gsm8k import main

pytestmark = pytest.mark.unit

GSM8K_RECORDS = [
    {
        "question": f"Tom has {n} apples and buys 1,000 more. How many now?",
        "answer": f"{n} + 1000\n#### {n + 1000:,}",
    }
    for n in (1, 2, 3, 4, 5)
]


def test_offline_default_is_reasoning_gym(tmp_path, capsys):
    main(["--out", str(tmp_path), "--train", "6", "--val", "3"])
    assert "train: 6 rows" in capsys.readouterr().out
    train, val = load_rows(tmp_path / "train.parquet"), load_rows(tmp_path / "val.parquet")
    assert (len(train), len(val)) == (6, 3)
    assert {r.data_source for r in train + val} == {"reasoning_gym/gsm_symbolic"}
    assert {r.agent_name for r in train} == {"tool_agent"}
    assert {r.extra_info.split for r in val} == {"val"}
    assert {r.extra_info.question for r in train}.isdisjoint(r.extra_info.question for r in val)
    for row in train + val:
        truth = row.reward_model.ground_truth
        assert row.extra_info.tools_kwargs == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": truth}}}
        assert row.extra_info.answer.endswith(f"#### {truth}")


def test_same_seed_same_rows(tmp_path):
    for name in ("a", "b"):
        gym = ["--gym-datasets", "gsm_symbolic,chain_sum"]
        main(["--out", str(tmp_path / name), "--train", "4", "--val", "2", *gym])
    assert load_rows(tmp_path / "a" / "train.parquet") == load_rows(tmp_path / "b" / "train.parquet")
    sources = [r.data_source for r in load_rows(tmp_path / "a" / "train.parquet")]
    assert sources == ["reasoning_gym/gsm_symbolic", "reasoning_gym/chain_sum"] * 2


def test_local_gsm8k_jsonl_single_turn(tmp_path):
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_RECORDS))
    main(["--out", str(tmp_path / "out"), "--source", str(source), "--val", "2"]
         + ["--agent-name", "single_turn_agent"])
    train, val = load_rows(tmp_path / "out" / "train.parquet"), load_rows(tmp_path / "out" / "val.parquet")
    assert [r.reward_model.ground_truth for r in train] == ["1001", "1002", "1003"]
    assert [r.reward_model.ground_truth for r in val] == ["1004", "1005"]
    assert {r.data_source for r in train} == {"openai/gsm8k"}
    assert all(r.agent_name == "single_turn_agent" and r.extra_info.tools_kwargs == {} for r in train + val)


def test_local_file_bad_row_names_file_and_row(tmp_path):
    source = tmp_path / "gsm8k.jsonl"
    broken = GSM8K_RECORDS[:3] + [{"question": "q"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in broken))
    with pytest.raises(DataError, match=f"^{source} row 3: missing key 'answer'$"):
        main(["--out", str(tmp_path / "out"), "--source", str(source), "--val", "1"])


def test_bad_source_and_sizes(tmp_path):
    with pytest.raises(DataError, match="not reasoning_gym, hub, or an existing file"):
        main(["--out", str(tmp_path), "--source", str(tmp_path / "missing.jsonl")])
    source = tmp_path / "gsm8k.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in GSM8K_RECORDS))
    with pytest.raises(DataError, match="5 rows, fewer than --train 4 \\+ --val 2"):
        main(["--out", str(tmp_path), "--source", str(source), "--train", "4", "--val", "2"])
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--gym-datasets", "sudoku"])
