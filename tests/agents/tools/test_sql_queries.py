"""Benign queries still answer correctly through run_readonly_query; schema reading; formatting."""

from __future__ import annotations

import pytest

from agents.tools.sql import ColumnInfo, SqlResult, format_table, read_schema, run_readonly_query
from tests.agents.tools.shop_db import sha256


def _files(shop_db):
    return sorted(p.name for p in shop_db.parent.iterdir())


@pytest.mark.unit
def test_join_group_by(shop_db):
    # London: Ada 10.5 + 4.5, Cy 1.25 + 3.75 = 20.0 over 4 orders; Paris: Bo 7.0 over 1.
    result = run_readonly_query(
        shop_db,
        "SELECT c.city, count(*) AS n, sum(o.amount) AS total FROM orders o "
        "JOIN customers c ON c.id = o.customer_id GROUP BY c.city ORDER BY c.city",
    )
    assert result == SqlResult(columns=("city", "n", "total"), rows=(("London", 4, 20.0), ("Paris", 1, 7.0)))


@pytest.mark.unit
def test_terminating_recursive_cte(shop_db):
    result = run_readonly_query(
        shop_db, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) SELECT sum(x) FROM c"
    )
    assert result.rows == ((15,),)


@pytest.mark.unit
def test_window_function(shop_db):
    # Ada's orders by amount: 10.5 (rank 1), 4.5 (rank 2); running total 10.5, 15.0.
    result = run_readonly_query(
        shop_db,
        "SELECT id, row_number() OVER w, sum(amount) OVER w FROM orders WHERE customer_id = 1 "
        "WINDOW w AS (ORDER BY amount DESC) ORDER BY id",
    )
    assert result.rows == ((1, 1, 10.5), (2, 2, 15.0))


@pytest.mark.unit
def test_view_subquery_and_functions(shop_db):
    result = run_readonly_query(
        shop_db,
        "-- big orders by customer\n"
        "SELECT upper(name), round(avg(amount), 2), group_concat(day, ';') FROM customers "
        "JOIN orders ON orders.customer_id = customers.id "
        "WHERE orders.id IN (SELECT id FROM big_orders) GROUP BY name ORDER BY name;",
    )
    assert result.rows == (("ADA", 10.5, "2024-01-01"), ("BO", 7.0, "2024-01-02"))


@pytest.mark.unit
def test_values_and_dates(shop_db):
    result = run_readonly_query(shop_db, "VALUES (date('2024-01-31', '+1 day'), julianday('2024-01-02') - julianday('2024-01-01'))")
    assert result.rows == (("2024-02-01", 1.0),)


@pytest.mark.unit
def test_benign_queries_touch_nothing(shop_db):
    before_hash, before_files = sha256(shop_db), _files(shop_db)
    for query in ["SELECT * FROM customers", "SELECT count(*) FROM numbers a, numbers b", "SELECT name FROM sqlite_master"]:
        assert run_readonly_query(shop_db, query).error is None
    assert sha256(shop_db) == before_hash and _files(shop_db) == before_files


@pytest.mark.unit
def test_truncation_at_max_rows(shop_db):
    cut = run_readonly_query(shop_db, "SELECT id FROM orders ORDER BY id", max_rows=3)
    assert cut.rows == ((1,), (2,), (3,)) and cut.truncated
    whole = run_readonly_query(shop_db, "SELECT id FROM orders ORDER BY id", max_rows=5)
    assert len(whole.rows) == 5 and not whole.truncated


@pytest.mark.unit
def test_infinite_generator_is_cut_not_interrupted(shop_db):
    # Rows are pulled lazily, so an unbounded recursive CTE without aggregation just truncates.
    result = run_readonly_query(shop_db, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c", max_rows=4)
    assert result.rows == ((1,), (2,), (3,), (4,)) and result.truncated and result.error is None


@pytest.mark.unit
def test_sql_error_is_returned_not_raised(shop_db):
    result = run_readonly_query(shop_db, "SELECT nope FROM customers")
    assert result.error == "no such column: nope"
    assert not result.ok


@pytest.mark.unit
def test_read_schema(shop_db):
    tables = {t.name: t for t in read_schema(shop_db)}
    assert sorted(tables) == ["big_orders", "customers", "numbers", "orders"]
    assert tables["customers"].columns == (
        ColumnInfo("id", "INTEGER", True),
        ColumnInfo("name", "TEXT", False),
        ColumnInfo("city", "TEXT", False),
    )
    assert tables["big_orders"].kind == "view"


@pytest.mark.unit
def test_format_table():
    result = SqlResult(columns=("a", "b"), rows=((1, None), ("x\ny", b"\x00\x01")), truncated=True)
    assert format_table(result) == "a | b\n1 | NULL\nx y | <blob 2 bytes>\n(2 rows shown; more rows were cut)"
    assert format_table(SqlResult(error="boom")) == "error: boom"


@pytest.mark.unit
def test_format_table_caps_length():
    result = SqlResult(columns=("x",), rows=tuple((str(i) * 50,) for i in range(100)))
    text = format_table(result, max_chars=500, max_cell_chars=20)
    assert len(text) <= 500
    assert "0" * 17 + "..." in text
    assert text.endswith("more rows were cut)")
