"""DatasetRow validation and load_rows: good rows load from jsonl and parquet, bad rows name file/row/key."""

import copy
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from agents.data.rows import DataError, DatasetRow, load_rows, write_jsonl, write_parquet

pytestmark = pytest.mark.unit

ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "5"},
    "extra_info": {
        "index": 0,
        "question": "What is 2 + 3?",
        "answer": "2 + 3 = 5\n#### 5",
        "split": "train",
        "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "5"}}},
    },
    "agent_name": "tool_agent",
}


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _variant(**changes):
    row = copy.deepcopy(ROW)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = row
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return row


def test_valid_row_round_trips_through_jsonl_and_parquet(tmp_path):
    rows = [DatasetRow.model_validate(_variant(extra_info__index=i)) for i in range(3)]
    from_jsonl = load_rows(write_jsonl(rows, tmp_path / "x.jsonl"))
    from_parquet = load_rows(write_parquet(rows, tmp_path / "x.parquet"))
    assert from_jsonl == from_parquet == rows
    assert from_jsonl[2].extra_info.index == 2
    assert from_jsonl[0].messages() == [{"role": "user", "content": "What is 2 + 3?"}]


def test_empty_tools_kwargs_survive_parquet(tmp_path):
    # Parquet cannot hold an empty struct; an empty tools_kwargs still round-trips as {}.
    rows = [DatasetRow.model_validate(_variant(extra_info__tools_kwargs={}))]
    assert load_rows(write_parquet(rows, tmp_path / "x.parquet"))[0].extra_info.tools_kwargs == {}


def test_agent_name_defaults_to_verls_single_turn_loop():
    assert DatasetRow.model_validate(_variant(agent_name=KeyError)).agent_name == "single_turn_agent"


def test_missing_key_names_file_row_and_key(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [ROW, _variant(prompt=KeyError)])
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value) == f"{path} row 1 (line 2): missing key 'prompt'"


def test_missing_nested_key(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [_variant(reward_model__ground_truth=KeyError)])
    with pytest.raises(DataError, match=r"row 0 \(line 1\): missing key 'reward_model.ground_truth'"):
        load_rows(path)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"extra_info__index": "seven"}, "extra_info.index"),
        ({"extra_info__index": -1}, "extra_info.index"),
        ({"prompt": "What is 2 + 3?"}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"ability": 3}, "ability"),
        ({"reward_model__style": "model"}, "reward_model.style"),
        ({"extra_info__tools_kwargs": {"calc": 5}}, "extra_info.tools_kwargs.calc"),
    ],
)
def test_wrong_types_name_the_key(tmp_path, change, key):
    path = _write_jsonl(tmp_path / "x.jsonl", [ROW, ROW, _variant(**change)])
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value).startswith(f"{path} row 2 (line 3): key '{key}'")


def test_bad_role_names_message_index(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [_variant(prompt=[{"role": "robot", "content": "hi"}])])
    with pytest.raises(DataError, match=r"key 'prompt.0.role'"):
        load_rows(path)


def test_parquet_null_cell_names_row_and_key(tmp_path):
    rows = [_variant(extra_info__index=i) for i in range(3)]
    rows[1]["ability"] = None
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(DataError) as info:
        load_rows(path)
    assert str(info.value).startswith(f"{path} row 1: key 'ability': Input should be a valid string")


def test_parquet_struct_union_drops_tools_a_row_does_not_use(tmp_path):
    # Parquet gives row 0 a None entry for the tool only row 1 has.
    other = _variant(extra_info__tools_kwargs={"calculator": {"create_kwargs": {"precision": 2}}})
    path = tmp_path / "x.parquet"
    pq.write_table(pa.Table.from_pylist([ROW, other]), path)
    rows = load_rows(path)
    assert list(rows[0].extra_info.tools_kwargs) == ["calc_gsm8k_reward"]
    assert list(rows[1].extra_info.tools_kwargs) == ["calculator"]


def test_file_level_errors(tmp_path):
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(ROW) + "\n\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl row 1 \(line 3\): invalid JSON"):
        load_rows(bad_json)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="empty.jsonl: no rows"):
        load_rows(empty)
    with pytest.raises(DataError, match="unsupported extension '.csv'"):
        load_rows(_write_jsonl(tmp_path / "x.csv", [ROW]))
    with pytest.raises(DataError, match="no such file"):
        load_rows(tmp_path / "missing.jsonl")
    not_object = _write_jsonl(tmp_path / "list.jsonl", [[1, 2]])
    with pytest.raises(DataError, match=r"list.jsonl row 0 \(line 1\): a row must be an object, got list"):
        load_rows(not_object)
