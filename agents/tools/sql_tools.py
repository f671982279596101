"""The SQL tools a model calls: search_schema, get_columns, execute_sql (agents layer: pure asyncio).

Each episode's database comes from ``create_kwargs["db_path"]`` (the row's ``tools_kwargs``) or, for
all episodes, from the tool config's ``db_path``; a relative path is joined to config ``db_root``.
Queries run in a worker thread (``asyncio.to_thread``) so a slow query never stalls the event loop
that drives the other episodes; ``run_readonly_query`` bounds how long it can take.
"""

from __future__ import annotations

import asyncio
import difflib
from pathlib import Path
from typing import Any

from agents.tools.base import Tool, ToolError
from agents.tools.sql import TableInfo, format_table, read_schema, run_readonly_query


def _function_schema(name: str, description: str, arg: str, arg_description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": arg_description}},
                "required": [arg],
            },
        },
    }


def _string_arg(tool: str, arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        got = "nothing" if value is None else type(value).__name__
        raise ToolError(f"{tool}: argument {key!r} must be a string, got {got}")
    return value


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n... (output cut)"


def _describe(table: TableInfo, only: set[str] | None = None) -> str:
    cols = [
        f"{c.name} {c.type}".rstrip() + (" PK" if c.primary_key else "")
        for c in table.columns
        if only is None or c.name in only
    ]
    return f"{table.kind} {table.name}: " + ", ".join(cols)


class _SqlTool(Tool):
    """Shared per-episode database bookkeeping and config (timeout_s, max_rows, max_output_chars)."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        super().__init__(config, tool_schema)
        self.timeout_s = float(self.config.get("timeout_s", 2.0))
        self.max_rows = int(self.config.get("max_rows", 50))
        self.max_output_chars = int(self.config.get("max_output_chars", 4000))
        self._db_paths: dict[str, Path] = {}
        self._schemas: dict[tuple[Path, int, int], tuple[TableInfo, ...]] = {}

    def _resolve(self, db_path: str | Path) -> Path:
        path = Path(db_path)
        if not path.is_absolute() and self.config.get("db_root"):
            path = Path(self.config["db_root"]) / path
        return path

    async def create(self, instance_id: str, db_path: str | None = None, **create_kwargs: Any) -> None:
        if create_kwargs:
            raise ValueError(
                f"tool {self.name} instance {instance_id}: unknown create_kwargs {sorted(create_kwargs)}"
            )
        if db_path is not None:
            self._db_paths[instance_id] = self._resolve(db_path)

    async def release(self, instance_id: str) -> None:
        self._db_paths.pop(instance_id, None)

    def assets(self, create_kwargs: dict[str, Any]) -> list[str]:
        db_path = create_kwargs.get("db_path") or self.config.get("db_path")
        return [str(self._resolve(db_path))] if db_path else []

    def db_path(self, instance_id: str) -> Path:
        if instance_id in self._db_paths:
            return self._db_paths[instance_id]
        if self.config.get("db_path"):
            return self._resolve(self.config["db_path"])
        raise ValueError(
            f"tool {self.name} instance {instance_id}: no database "
            "(set create_kwargs db_path or config db_path)"
        )

    async def schema_of(self, instance_id: str) -> tuple[TableInfo, ...]:
        path = self.db_path(instance_id).resolve()
        stat = path.stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key not in self._schemas:
            self._schemas[key] = await asyncio.to_thread(read_schema, path)
        return self._schemas[key]


class SearchSchemaTool(_SqlTool):
    """Tables and columns whose names contain a keyword (case-insensitive)."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return _function_schema(
            "search_schema",
            "Find tables and columns of the database whose names contain a keyword. "
            "An empty keyword lists every table.",
            "keyword",
            "Part of a table or column name, e.g. 'customer'.",
        )

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        keyword = _string_arg(self.name, arguments, "keyword").strip().lower()
        tables = await self.schema_of(instance_id)
        lines = []
        for table in tables:
            if keyword in table.name.lower():
                lines.append(_describe(table))
                continue
            hits = {c.name for c in table.columns if keyword in c.name.lower()}
            if hits:
                lines.append(_describe(table, only=hits))
        if not lines:
            names = ", ".join(t.name for t in tables)
            return f"no table or column name contains {keyword!r}. Tables: {names}"
        return _clip("\n".join(lines), self.max_output_chars)


class GetColumnsTool(_SqlTool):
    """The columns (name, declared type, primary key) of one table or view."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return _function_schema(
            "get_columns",
            "List the columns of one table or view with their types.",
            "table",
            "The table or view name.",
        )

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        wanted = _string_arg(self.name, arguments, "table").strip().strip('"`[]')
        tables = await self.schema_of(instance_id)
        by_name = {t.name.lower(): t for t in tables}
        table = by_name.get(wanted.lower())
        if table is None:
            close = difflib.get_close_matches(wanted.lower(), list(by_name), n=3)
            hint = f" Did you mean {', '.join(by_name[c].name for c in close)}?" if close else ""
            names = ", ".join(t.name for t in tables)
            raise ToolError(f"no table named {wanted!r}.{hint} Tables: {names}")
        lines = [f"{table.kind} {table.name}:"]
        lines += [
            f"  {c.name} {c.type}".rstrip() + (" PRIMARY KEY" if c.primary_key else "") for c in table.columns
        ]
        return _clip("\n".join(lines), self.max_output_chars)


class ExecuteSqlTool(_SqlTool):
    """Runs one read-only SELECT and returns a compact text table."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return _function_schema(
            "execute_sql",
            "Run one read-only SQLite SELECT query and return the result rows.",
            "query",
            "A single SQLite SELECT statement.",
        )

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        query = _string_arg(self.name, arguments, "query")
        path = self.db_path(instance_id)
        result = await asyncio.to_thread(
            run_readonly_query, path, query, timeout_s=self.timeout_s, max_rows=self.max_rows
        )
        if result.error is not None:
            raise ToolError(f"SQL error: {result.error}")
        return format_table(result, max_chars=self.max_output_chars)
