"""Attacks on run_readonly_query: every one must fail, leave the file's bytes alone and create no file."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from agents.tools.sql import MAX_SQL_CHARS, open_readonly, run_readonly_query
from tests.agents.tools.shop_db import build_shop_db, sha256

# 10^5 characters of 'x', built without zeroblob/randomblob/printf.
BIG = "replace(" * 5 + "'x'" + ", 'x', 'xxxxxxxxxx')" * 5
WIDE = "WITH b(h) AS (SELECT substr({big}, 1, 90000)) SELECT {cols} FROM b, numbers"

# (id, query template, substring expected in the error). "{dir}" is the database's folder.
ATTACKS = [
    ("insert", "INSERT INTO customers VALUES (9, 'Eve', 'Nowhere')", "only read-only"),
    ("update", "UPDATE orders SET amount = 0", "only read-only"),
    ("delete", "DELETE FROM orders", "only read-only"),
    ("create_table", "CREATE TABLE evil (x)", "only read-only"),
    ("drop_table", "DROP TABLE orders", "only read-only"),
    ("replace", "REPLACE INTO customers VALUES (1, 'Eve', 'Nowhere')", "only read-only"),
    ("alter", "ALTER TABLE customers ADD COLUMN pwned TEXT", "only read-only"),
    ("create_index", "CREATE INDEX evil_idx ON orders(amount)", "only read-only"),
    ("cte_insert", "WITH x(a) AS (SELECT 9) INSERT INTO customers(id, name) SELECT a, 'e' FROM x", "INSERT"),
    ("cte_delete", "WITH x AS (SELECT 1) DELETE FROM orders WHERE id IN (SELECT * FROM x)", "DELETE"),
    ("cte_update", "WITH x AS (SELECT 1) UPDATE orders SET amount = 0 WHERE id IN x", "UPDATE"),
    ("attach_abs", "ATTACH DATABASE '{dir}/stolen.db' AS s", "only read-only"),
    ("attach_relative", "ATTACH 'relative.db' AS s", "only read-only"),
    ("attach_uri_rwc", "ATTACH 'file:{dir}/uri.db?mode=rwc' AS s", "only read-only"),
    ("vacuum_into", "VACUUM INTO '{dir}/copy.db'", "only read-only"),
    ("vacuum", "VACUUM", "only read-only"),
    ("temp_table", "CREATE TEMP TABLE t AS SELECT * FROM customers", "only read-only"),
    ("temp_view", "CREATE TEMP VIEW v AS SELECT 1", "only read-only"),
    ("temp_trigger", "CREATE TEMP TRIGGER tr AFTER INSERT ON customers BEGIN SELECT 1; END", "only read-only"),
    ("pragma_writable_schema", "PRAGMA writable_schema = ON", "only read-only"),
    ("pragma_journal_mode", "PRAGMA journal_mode = WAL", "only read-only"),
    ("pragma_query_only_off", "PRAGMA query_only = OFF", "only read-only"),
    ("pragma_function", "SELECT * FROM pragma_database_list", "not authorized"),
    ("begin", "BEGIN IMMEDIATE", "only read-only"),
    ("analyze", "ANALYZE", "only read-only"),
    ("reindex", "REINDEX", "only read-only"),
    ("comment_disguise", "/* SELECT */ -- SELECT\n DELETE FROM orders", "'DELETE'"),
    ("load_extension", "SELECT load_extension('{dir}/evil.so')", "load_extension"),
    ("fts3_tokenizer", "SELECT fts3_tokenizer('simple')", "fts3_tokenizer"),
    ("multi_statement_drop", "SELECT 1; DROP TABLE customers", "one statement"),
    ("multi_statement_attach", "SELECT 1; ATTACH '{dir}/m.db' AS m", "one statement"),
    ("zeroblob_bomb", "SELECT zeroblob(1000000000)", "zeroblob"),
    ("randomblob_bomb", "SELECT length(randomblob(1e9))", "randomblob"),
    ("hex_zeroblob_bomb", "SELECT length(replace(hex(zeroblob(400000)), '0', 'aaaa'))", "zeroblob"),
    ("printf_width_bomb", "SELECT printf('%.*c', 1000000000, 'x')", "printf"),
    ("nested_replace_bomb", "SELECT length(" + "replace(" * 8 + "'x'" + ", 'x', 'xxxxxxxxxx')" * 8 + ")", "too big"),
    ("hex_doubling_bomb", "SELECT length(" + "hex(" * 20 + "'x'" + ")" * 21, "too big"),
    (
        "runaway_recursive_cte",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "interrupted",
    ),
    ("cross_join_explosion", "SELECT count(*) FROM numbers a, numbers b, numbers c, numbers d, numbers e", "interrupted"),
    (
        "group_concat_bomb",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT length(group_concat(x)) FROM c",
        "interrupted",
    ),
    ("too_many_columns", WIDE.format(big=BIG, cols=", ".join(["h"] * 600)), "too many columns"),
    ("huge_string_literal", "SELECT '" + "x" * MAX_SQL_CHARS + "'", "limit is"),
    ("nested_parentheses", "SELECT " + "(" * 5000 + "1" + ")" * 5000, "stack overflow"),
    ("deep_expression", "SELECT " + "1 + " * 3000 + "1", "too large"),
]

# Statements that change state when run without the guards: the control test proves they are real.
WRITES = [a for a in ATTACKS if a[0] in {
    "insert", "update", "delete", "create_table", "drop_table", "replace", "alter", "create_index",
    "cte_insert", "cte_delete", "cte_update", "attach_abs", "vacuum_into", "temp_table", "temp_view",
    "temp_trigger", "pragma_writable_schema", "pragma_journal_mode", "reindex", "analyze",
}]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.unit
@pytest.mark.parametrize("attack_id,template,expected", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_fails_and_leaves_no_trace(shop_db, attack_id, template, expected):
    before_hash, before_files = sha256(shop_db), _files(shop_db.parent)
    query = template.replace("{dir}", str(shop_db.parent))

    # Runaways get a short deadline; the rest a long one, so they fail for their own reason.
    result = run_readonly_query(shop_db, query, timeout_s=0.3 if expected == "interrupted" else 10.0)

    assert result.error is not None and expected in result.error, (attack_id, result)
    assert result.rows == () and result.columns == ()
    assert sha256(shop_db) == before_hash
    assert _files(shop_db.parent) == before_files


@pytest.mark.unit
@pytest.mark.parametrize("attack_id,template,expected", WRITES, ids=[a[0] for a in WRITES])
def test_write_attacks_are_real_without_the_guards(tmp_path, attack_id, template, expected):
    # Control: on a plain writable connection the same statement runs and changes something,
    # so the refusal above is not an accident of bad syntax.
    db = build_shop_db(tmp_path / "plain.sqlite")
    before_hash, before_files = sha256(db), _files(tmp_path)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(template.replace("{dir}", str(tmp_path)))
    temp_objects = conn.execute("SELECT count(*) FROM sqlite_temp_master").fetchone()[0]
    writable_schema = conn.execute("PRAGMA writable_schema").fetchone()[0]
    conn.close()
    changed = sha256(db) != before_hash or _files(tmp_path) != before_files
    assert changed or temp_objects > 0 or writable_schema == 1


@pytest.mark.unit
@pytest.mark.parametrize("attack_id,template,expected", WRITES, ids=[a[0] for a in WRITES])
def test_connection_guards_refuse_writes_without_the_keyword_check(shop_db, attack_id, template, expected):
    # Defense in depth: the hardened connection alone (URI flags, query_only, authorizer) refuses too.
    before_hash, before_files = sha256(shop_db), _files(shop_db.parent)
    conn, _ = open_readonly(shop_db)
    try:
        with pytest.raises(sqlite3.DatabaseError):
            conn.execute(template.replace("{dir}", str(shop_db.parent))).fetchall()
    finally:
        conn.close()
    assert sha256(shop_db) == before_hash
    assert _files(shop_db.parent) == before_files


@pytest.mark.unit
def test_wide_result_is_cut_at_the_byte_budget(shop_db):
    # 100 rows x 400 columns x 90 kB would be 3.6 GB of Python strings; the budget stops at 1 MB.
    query = WIDE.format(big=BIG, cols=", ".join(["h"] * 400))
    result = run_readonly_query(shop_db, query, max_result_bytes=1_000_000)
    assert result.error is None and result.truncated and result.rows == ()
    small = run_readonly_query(shop_db, WIDE.format(big=BIG, cols="h, h"), max_result_bytes=1_000_000)
    assert small.truncated and len(small.rows) == 5  # 5 rows x 2 x 90 kB fit, the sixth does not


@pytest.mark.unit
def test_mode_ro_alone_would_leave_wal_files(tmp_path):
    # Why immutable=1: a plain mode=ro reader of a WAL database creates -wal/-shm files.
    db = build_shop_db(tmp_path / "w.sqlite", "wal")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.execute("SELECT count(*) FROM customers").fetchall()
    conn.close()
    assert _files(tmp_path) == ["w.sqlite", "w.sqlite-shm", "w.sqlite-wal"]


@pytest.mark.unit
def test_database_with_live_wal_is_refused(tmp_path):
    db = build_shop_db(tmp_path / "live.sqlite", "wal")
    writer = sqlite3.connect(db)
    writer.execute("INSERT INTO numbers VALUES (101)")
    writer.commit()  # the row now lives only in live.sqlite-wal until a checkpoint
    try:
        result = run_readonly_query(db, "SELECT count(*) FROM numbers")
    finally:
        writer.close()
    assert result.error is not None and "-wal" in result.error


@pytest.mark.unit
def test_missing_database_is_an_error_and_creates_nothing(tmp_path):
    result = run_readonly_query(tmp_path / "nope.sqlite", "SELECT 1")
    assert result.error is not None and "nope.sqlite" in result.error
    assert _files(tmp_path) == []


@pytest.mark.unit
def test_database_is_read_after_many_attacks(shop_db):
    for _, template, _ in ATTACKS[:12]:
        run_readonly_query(shop_db, template.replace("{dir}", str(shop_db.parent)))
    result = run_readonly_query(shop_db, "SELECT count(*), sum(amount) FROM orders")
    assert result.rows == ((5, 27.0),)


@pytest.mark.unit
def test_shutil_copy_of_database_keeps_working(tmp_path, shop_db):
    # The file is an ordinary SQLite file afterwards: nothing was locked or rewritten.
    copy = Path(shutil.copy(shop_db, tmp_path / "copy.sqlite"))
    conn = sqlite3.connect(copy)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
