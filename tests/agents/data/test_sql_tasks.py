"""SQL task data without the network: question sets, the insurance database, the Chinook mapping, rows."""

import hashlib
import json
import sqlite3

import pytest

from agents.data.chinook_db import build_chinook_db
from agents.data.insurance_db import build_insurance_db, insurance_rows
from agents.data.sql_questions import QUESTIONS
from agents.data.sql_tasks import SQL_TOOLS, sql_splits

pytestmark = pytest.mark.unit


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def insurance_db(tmp_path_factory):
    return build_insurance_db(tmp_path_factory.mktemp("ins") / "insurance.sqlite", seed=0)


@pytest.mark.parametrize("db_id", ["insurance", "chinook"])
def test_question_sets_are_large_and_distinct(db_id):
    pairs = QUESTIONS[db_id]
    assert len(pairs) >= 25
    assert len({q for q, _ in pairs}) == len({s for _, s in pairs}) == len(pairs)
    joined = " ".join(s for _, s in pairs)
    for clause in ("JOIN", "GROUP BY", "ORDER BY", "HAVING", "COUNT(", "SUM(", "AVG("):
        assert clause in joined, f"{db_id} has no query using {clause}"


def test_insurance_db_is_identical_for_a_seed(tmp_path, insurance_db):
    again = build_insurance_db(tmp_path / "again.sqlite", seed=0)
    other = build_insurance_db(tmp_path / "other.sqlite", seed=1)
    assert _sha(again) == _sha(insurance_db)
    assert insurance_rows(1) != insurance_rows(0)
    assert _sha(other) != _sha(insurance_db)


def test_insurance_db_shape_and_foreign_keys(insurance_db):
    conn = sqlite3.connect(insurance_db)
    tables = ("customer", "policy", "claim")
    counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}
    assert counts == {"customer": 120, "policy": 220, "claim": 160}
    assert conn.execute("SELECT COUNT(*) FROM claim_payment").fetchone()[0] > 100
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    # Every customer holds a policy; only approved/paid claims have payments.
    without_policy = "SELECT COUNT(*) FROM customer WHERE customer_id NOT IN (SELECT customer_id FROM policy)"
    assert conn.execute(without_policy).fetchone() == (0,)
    statuses = conn.execute(
        "SELECT DISTINCT cl.status FROM claim cl JOIN claim_payment cp ON cp.claim_id = cl.claim_id ORDER BY 1"
    ).fetchall()
    assert statuses == [("approved",), ("paid",)]


def test_insurance_gold_queries_return_rows(insurance_db):
    conn = sqlite3.connect(insurance_db)
    for question, sql in QUESTIONS["insurance"]:
        assert conn.execute(sql).fetchall(), question


def test_chinook_mapping_on_a_hand_written_fixture(tmp_path):
    records = [
        {"model": "chinook.artist", "pk": 2, "fields": {"name": "Queen"}},
        {"model": "chinook.artist", "pk": 1, "fields": {"name": "AC/DC"}},
        {"model": "chinook.album", "pk": 1, "fields": {"title": "Let There Be Rock", "artist": 1}},
        {"model": "chinook.genre", "pk": 1, "fields": {"name": "Rock"}},
        {"model": "chinook.mediatype", "pk": 1, "fields": {"name": "MPEG audio file"}},
        {"model": "chinook.track", "pk": 5, "fields": {
            "name": "Whole Lotta Rosie", "album": 1, "mediatype": 1, "genre": 1, "composer": None,
            "milliseconds": 323761, "bytes": 10547154, "unit_price": 0.99}},
        {"model": "chinook.employee", "pk": 1, "fields": {
            "lastname": "Adams", "firstname": "Andrew", "hiredate": "2002-08-14T00:00:00Z"}},
        {"model": "chinook.playlist", "pk": 3, "fields": {"name": "Rockers"}},
        {"model": "chinook.playlisttrack", "pk": 1, "fields": {"playlist": 3, "track": 5}},
    ]
    fixture = tmp_path / "fixture.json"
    fixture.write_text(json.dumps(records))
    conn = sqlite3.connect(build_chinook_db(fixture, tmp_path / "chinook.sqlite"))
    assert conn.execute("SELECT ArtistId, Name FROM Artist").fetchall() == [(1, "AC/DC"), (2, "Queen")]
    assert conn.execute(
        "SELECT t.TrackId, t.Name, al.Title, ar.Name, t.Composer, t.UnitPrice FROM Track t "
        "JOIN Album al ON al.AlbumId = t.AlbumId JOIN Artist ar ON ar.ArtistId = al.ArtistId"
    ).fetchall() == [(5, "Whole Lotta Rosie", "Let There Be Rock", "AC/DC", None, 0.99)]
    employees = conn.execute("SELECT HireDate, ReportsTo FROM Employee").fetchall()
    assert employees == [("2002-08-14 00:00:00", None)]
    assert conn.execute("SELECT PlaylistId, TrackId FROM PlaylistTrack").fetchall() == [(3, 5)]


def test_chinook_unknown_model_is_an_error(tmp_path):
    fixture = tmp_path / "fixture.json"
    fixture.write_text(json.dumps([{"model": "chinook.band", "pk": 1, "fields": {}}]))
    with pytest.raises(ValueError, match="fixture record 0: unknown model 'chinook.band'"):
        build_chinook_db(fixture, tmp_path / "c.sqlite")


def test_sql_rows_point_tools_and_ground_truth_at_the_database(tmp_path):
    paths = {"insurance": tmp_path / "i.sqlite", "chinook": tmp_path / "c.sqlite"}
    splits = sql_splits(paths)
    n_questions = len(QUESTIONS["insurance"]) + len(QUESTIONS["chinook"])
    assert len(splits["train"]) + len(splits["val"]) == n_questions
    assert len(splits["val"]) == len(QUESTIONS["insurance"]) // 5 + len(QUESTIONS["chinook"]) // 5
    val_questions = {r.extra_info.question for r in splits["val"]}
    assert val_questions.isdisjoint(r.extra_info.question for r in splits["train"])
    for split, rows in splits.items():
        assert [r.extra_info.index for r in rows] == list(range(len(rows)))
        for row in rows:
            db_id = row.extra_info.db_id
            db_path = str(paths[db_id])
            assert row.extra_info.db_path == db_path
            assert row.reward_model.ground_truth == row.extra_info.answer
            assert row.extra_info.answer in {sql for _, sql in QUESTIONS[db_id]}
            expected_kwargs = {t: {"create_kwargs": {"db_path": db_path}} for t in SQL_TOOLS}
            assert row.extra_info.tools_kwargs == expected_kwargs
            assert (row.agent_name, row.ability, row.extra_info.split) == ("tool_agent", "sql", split)
            assert row.data_source == f"sql/{db_id}"
            assert [m.role for m in row.prompt] == ["system", "user"]
