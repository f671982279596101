"""The model-facing SQL tools over a real SQLite file."""

from __future__ import annotations

import asyncio

import pytest

from agents.tools.base import ToolError
from agents.tools.sql_tools import ExecuteSqlTool, GetColumnsTool, SearchSchemaTool


def run(coro):
    return asyncio.run(coro)


@pytest.mark.unit
def test_execute_sql_with_db_from_create_kwargs(shop_db):
    tool = ExecuteSqlTool()

    async def episode():
        await tool.create("ep1", db_path=str(shop_db))
        text = await tool.execute("ep1", {"query": "SELECT id, name FROM customers ORDER BY id"})
        await tool.release("ep1")
        return text

    assert run(episode()) == "id | name\n1 | Ada\n2 | Bo\n3 | Cy\n(3 rows)"


@pytest.mark.unit
def test_execute_sql_db_from_config_root_and_max_rows(shop_db):
    tool = ExecuteSqlTool({"db_root": str(shop_db.parent), "db_path": shop_db.name, "max_rows": 2})
    text = run(tool.execute("any", {"query": "SELECT x FROM numbers ORDER BY x"}))
    assert text == "x\n1\n2\n(2 rows shown; more rows were cut)"


@pytest.mark.unit
def test_execute_sql_errors_are_tool_errors(shop_db):
    tool = ExecuteSqlTool({"db_path": str(shop_db)})
    with pytest.raises(ToolError, match="only read-only SELECT"):
        run(tool.execute("ep", {"query": "DROP TABLE customers"}))
    with pytest.raises(ToolError, match="no such table: nope"):
        run(tool.execute("ep", {"query": "SELECT * FROM nope"}))
    with pytest.raises(ToolError, match="argument 'query' must be a string, got nothing"):
        run(tool.execute("ep", {}))


@pytest.mark.unit
def test_missing_database_configuration_names_the_instance():
    with pytest.raises(ValueError, match="instance ep7: no database"):
        run(ExecuteSqlTool().execute("ep7", {"query": "SELECT 1"}))


@pytest.mark.unit
def test_unknown_create_kwargs_are_refused(shop_db):
    with pytest.raises(ValueError, match=r"unknown create_kwargs \['db'\]"):
        run(ExecuteSqlTool().create("ep", db=str(shop_db)))


@pytest.mark.unit
def test_search_schema_matches_tables_and_columns(shop_db):
    tool = SearchSchemaTool({"db_path": str(shop_db)})
    # "order" names two tables (all columns listed); "city" only a column of customers.
    assert run(tool.execute("ep", {"keyword": "ORDER"})) == (
        "view big_orders: id INTEGER, amount REAL\n"
        "table orders: id INTEGER PK, customer_id INTEGER, amount REAL, day TEXT"
    )
    assert run(tool.execute("ep", {"keyword": "city"})) == "table customers: city TEXT"
    assert run(tool.execute("ep", {"keyword": ""})).count("\n") == 3  # empty keyword: all four tables
    assert run(tool.execute("ep", {"keyword": "zzz"})) == (
        "no table or column name contains 'zzz'. Tables: big_orders, customers, numbers, orders"
    )


@pytest.mark.unit
def test_get_columns(shop_db):
    tool = GetColumnsTool({"db_path": str(shop_db)})
    assert run(tool.execute("ep", {"table": "Customers"})) == (
        "table customers:\n  id INTEGER PRIMARY KEY\n  name TEXT\n  city TEXT"
    )
    with pytest.raises(ToolError, match="no table named 'order'. Did you mean orders"):
        run(tool.execute("ep", {"table": "order"}))


@pytest.mark.unit
def test_per_instance_databases_are_separate(shop_db, tmp_path):
    import sqlite3

    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.execute("INSERT INTO t VALUES ('other')")
    conn.commit()
    conn.close()
    tool = ExecuteSqlTool()

    async def both():
        await tool.create("a", db_path=str(shop_db))
        await tool.create("b", db_path=str(other))
        return await asyncio.gather(
            tool.execute("a", {"query": "SELECT count(*) FROM customers"}),
            tool.execute("b", {"query": "SELECT v FROM t"}),
        )

    assert run(both()) == ["count(*)\n3\n(1 rows)", "v\nother\n(1 rows)"]
