"""Read-only SQLite access for model-written SQL (agents layer: pure, stdlib only).

Every query a model writes goes through ``run_readonly_query``. The hardening is layered because no
single SQLite switch is enough (measured, see DESIGN.md): ``mode=ro`` alone still lets ``ATTACH`` and
``VACUUM INTO`` create files and, on a WAL database, leaves ``-wal``/``-shm`` files behind.

1. URI ``mode=ro&immutable=1``. ``immutable`` makes SQLite skip locking and the WAL/journal entirely, so
   no sidecar file is ever created. That is only sound for a database nobody writes while we read, so
   a database with a live ``-wal`` or ``-journal`` sidecar is refused rather than read stale.
2. ``PRAGMA query_only=ON`` and ``SQLITE_LIMIT_ATTACHED=0``.
3. An allow-list authorizer: SELECT, READ, RECURSIVE and calls to ``SAFE_FUNCTIONS`` only; everything
   else (writes, PRAGMA, ATTACH, temp objects, transactions, table-valued pragmas) is denied.
4. The statement must start with SELECT / WITH / VALUES; one statement only (``execute``, never
   ``executescript``).
5. Size limits: SQL text length, string/blob length (blob bombs hit "string or blob too big"),
   expression depth, compound selects, program size; ``zeroblob``/``randomblob``/``printf`` are not
   allowed. Single string functions (``instr``, ``replace``) cost O(n*m) inside one VDBE op where the
   deadline cannot reach, so the length cap is what bounds them (1 MB values took ~4 s; 100 kB, ~0.05 s).
6. A progress-handler deadline interrupts runaway queries (recursive CTEs, cross-join explosions).
7. Rows are fetched one at a time, at most ``max_rows + 1`` of them and at most ``max_result_bytes``
   in all (200 rows of 500 columns of 100 kB each would otherwise be 10 GB); ``truncated`` says so.

Not bounded here: scratch space. Sorts and UNION sets that outgrow the page cache spill to SQLite's
anonymous temp files (deleted on close); a 2 s runaway wrote ~300 MB there while RSS stayed ~20 MB.
"""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_SQL_CHARS = 20_000
MAX_RESULT_BYTES = 4_000_000  # default budget for all returned cells together
MAX_VALUE_BYTES = 100_000  # longest string/blob any value may have; also bounds O(n*m) instr/replace
PROGRESS_EVERY_OPS = 1_000  # VDBE instructions between deadline checks

# sqlite3 limit id -> value; applied to every connection before any statement runs.
_LIMITS: dict[int, int] = {
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
    sqlite3.SQLITE_LIMIT_LENGTH: MAX_VALUE_BYTES,
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: MAX_SQL_CHARS,
    sqlite3.SQLITE_LIMIT_COLUMN: 500,  # also the widest table a database may have
    sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 100,
    sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 50,
    sqlite3.SQLITE_LIMIT_VDBE_OP: 50_000,
    sqlite3.SQLITE_LIMIT_FUNCTION_ARG: 32,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1_000,
    sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 0,  # model SQL never has parameters
    sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH: 0,
    sqlite3.SQLITE_LIMIT_WORKER_THREADS: 0,
}

# Scalar, aggregate and window functions a query may call. Deliberately absent: load_extension,
# zeroblob and randomblob (blob bombs), printf/format (``printf('%.*c', 1e9, 'x')`` spins for seconds
# inside one VDBE op, out of the progress handler's reach), sqlite_log, fts3_tokenizer, fts/rtree.
SAFE_FUNCTIONS = frozenset(
    """
    abs avg count max min sum total group_concat string_agg
    length octet_length lower upper substr substring trim ltrim rtrim replace instr char unicode
    hex quote concat concat_ws soundex like glob
    coalesce ifnull iif nullif typeof likelihood likely unlikely random
    round ceil ceiling floor trunc sign sqrt pow power exp ln log log10 log2 mod pi
    sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh degrees radians
    date time datetime julianday strftime unixepoch timediff current_date current_time current_timestamp
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value nth_value
    json json_array json_array_length json_extract json_object json_quote json_type json_valid
    json_group_array json_group_object json_pretty -> ->>
    sqlite_version
    """.split()
)

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_FIRST_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES"})
_LEADING_NOISE = re.compile(r"(?:\s|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)


@dataclass(frozen=True)
class SqlResult:
    """The outcome of one query. ``error`` is None on success; on error ``rows`` is empty."""

    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    truncated: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


# Authorizer action codes by name, to tell the model what was refused.
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{n}"): n.replace("_", " ")
    for n in (
        "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER "
        "CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX "
        "DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA "
        "TRANSACTION UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE "
        "SAVEPOINT"
    ).split()
}


class _Authorizer:
    """Allow-list authorizer; remembers the first thing it refused (for the error message)."""

    def __init__(self, extra_pragmas: frozenset[str] = frozenset()):
        self.extra_pragmas = extra_pragmas
        self.denied: str | None = None

    def __call__(self, action: int, arg1: str | None, arg2: str | None, *_: str | None) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in SAFE_FUNCTIONS:
                return sqlite3.SQLITE_OK
            what = f"function {arg2}()"
        elif action == sqlite3.SQLITE_PRAGMA and arg1 in self.extra_pragmas:
            return sqlite3.SQLITE_OK
        else:
            what = _ACTION_NAMES.get(action, f"action {action}")
            what += f" {arg1}" if action in (sqlite3.SQLITE_PRAGMA, sqlite3.SQLITE_ATTACH) else ""
        self.denied = self.denied or what
        return sqlite3.SQLITE_DENY


def _check_statement(query: str) -> str | None:
    """A reason to refuse ``query`` before SQLite sees it, or None."""
    if not isinstance(query, str):
        return f"query must be a string, got {type(query).__name__}"
    if len(query) > MAX_SQL_CHARS:
        return f"query is {len(query)} characters; the limit is {MAX_SQL_CHARS}"
    body = query[_LEADING_NOISE.match(query).end() :]
    first = re.match(r"[A-Za-z]+", body)
    keyword = first.group(0).upper() if first else body[:10]
    if keyword not in _FIRST_KEYWORDS:
        return f"only read-only SELECT queries are allowed (statement starts with {keyword!r})"
    return None


def _sidecar_error(path: Path) -> str | None:
    # immutable=1 ignores journals: reading a database that has one could return stale or torn data.
    for suffix in ("-wal", "-journal"):
        side = path.with_name(path.name + suffix)
        if side.exists() and side.stat().st_size > 0:
            return f"database {path.name} has a live {suffix} file; checkpoint it before querying"
    return None


def open_readonly(
    db_path: str | Path, authorizer: _Authorizer | None = None
) -> tuple[sqlite3.Connection, _Authorizer]:
    """A hardened connection (URI flags, limits, query_only, authorizer); raises on a bad path."""
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    problem = _sidecar_error(path)
    if problem:
        raise sqlite3.OperationalError(problem)
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, cached_statements=0)
    authorizer = authorizer or _Authorizer()
    try:
        for limit_id, value in _LIMITS.items():
            conn.setlimit(limit_id, value)
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        conn.execute("PRAGMA query_only=ON")  # before the authorizer, which denies every PRAGMA
        conn.set_authorizer(authorizer)
    except BaseException:
        conn.close()
        raise
    return conn, authorizer


class _Deadline:
    """Progress handler: a non-zero return aborts the running statement with SQLITE_INTERRUPT."""

    def __init__(self, timeout_s: float):
        self.deadline = time.monotonic() + timeout_s
        self.fired = False

    def __call__(self) -> int:
        self.fired = self.fired or time.monotonic() > self.deadline
        return int(self.fired)


def _error_text(exc: BaseException, authorizer: _Authorizer, deadline: _Deadline, timeout_s: float) -> str:
    if deadline.fired:
        return f"query interrupted: it ran longer than {timeout_s:g} s"
    if authorizer.denied:
        return f"not authorized: {authorizer.denied} (only read-only SELECT queries and safe functions)"
    return str(exc) or type(exc).__name__


def _cell_bytes(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes)) else 8


def _fetch(cursor: sqlite3.Cursor, max_rows: int, max_result_bytes: int) -> tuple[list[tuple], bool]:
    rows: list[tuple] = []
    budget = max_result_bytes
    for row in cursor:  # steps the statement one row at a time
        budget -= sum(_cell_bytes(v) for v in row)
        if len(rows) == max_rows or budget < 0:
            return rows, True
        rows.append(tuple(row))
    return rows, False


def run_readonly_query(
    db_path: str | Path,
    query: str,
    *,
    timeout_s: float = 2.0,
    max_rows: int = 200,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> SqlResult:
    """Run one read-only statement. Never raises for a bad query: the reason is in ``error``."""
    if max_rows < 0 or timeout_s <= 0:
        raise ValueError(f"max_rows must be >= 0 and timeout_s > 0, got {max_rows}, {timeout_s}")
    refused = _check_statement(query)
    if refused:
        return SqlResult(error=refused)
    try:
        conn, authorizer = open_readonly(db_path)
    except (OSError, sqlite3.Error) as exc:
        return SqlResult(error=f"cannot open database: {exc}")
    deadline = _Deadline(timeout_s)
    try:
        conn.set_progress_handler(deadline, PROGRESS_EVERY_OPS)
        cursor = conn.execute(query)
        rows, truncated = _fetch(cursor, max_rows, max_result_bytes)
        columns = tuple(d[0] for d in cursor.description or ())
    except (sqlite3.Error, sqlite3.Warning, OverflowError, MemoryError, RecursionError, ValueError) as exc:
        return SqlResult(error=_error_text(exc, authorizer, deadline, timeout_s))
    finally:
        conn.close()
    return SqlResult(columns=columns, rows=tuple(rows), truncated=truncated)


@dataclass(frozen=True)
class ColumnInfo:
    """One column as ``read_schema`` reports it: name, declared type, and whether it is part of the primary key."""

    name: str
    type: str  # declared type, "" when none
    primary_key: bool


@dataclass(frozen=True)
class TableInfo:
    """One table or view with its columns, as ``read_schema`` reports it to the schema tools and ``schema_text``."""

    name: str
    kind: str  # "table" | "view"
    columns: tuple[ColumnInfo, ...]


def read_schema(db_path: str | Path) -> tuple[TableInfo, ...]:
    """Tables and views with their columns, read through the same hardened connection.

    Only fixed SQL runs here (names come from sqlite_master, quoted), so the authorizer may also allow
    the read-only ``table_info`` pragma. Raises on an unreadable database (a deployment error).
    """
    conn, _ = open_readonly(db_path, _Authorizer(extra_pragmas=frozenset({"table_info"})))
    try:
        listed = conn.execute(
            "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite!_%' ESCAPE '!' ORDER BY name"
        ).fetchall()
        tables = []
        for name, kind in listed:
            quoted = '"' + name.replace('"', '""') + '"'
            info = conn.execute(f"PRAGMA table_info({quoted})").fetchall()
            columns = tuple(ColumnInfo(str(c[1]), str(c[2] or ""), bool(c[5])) for c in info)
            tables.append(TableInfo(name, kind, columns))
    finally:
        conn.close()
    return tuple(tables)


def format_table(result: SqlResult, *, max_chars: int = 4000, max_cell_chars: int = 120) -> str:
    """A compact ``a | b`` text table for the model, at most ``max_chars`` characters."""
    if result.error is not None:
        return f"error: {result.error}"

    def cell(value: Any) -> str:
        if value is None:
            text = "NULL"
        elif isinstance(value, bytes):
            text = f"<blob {len(value)} bytes>"
        else:
            text = str(value).replace("\n", " ")
        return text if len(text) <= max_cell_chars else text[: max_cell_chars - 3] + "..."

    lines = [" | ".join(result.columns)]
    shown = 0
    for row in result.rows:
        line = " | ".join(cell(v) for v in row)
        if sum(len(x) + 1 for x in lines) + len(line) > max_chars - 60:  # keep room for the footer
            break
        lines.append(line)
        shown += 1
    more = result.truncated or shown < len(result.rows)
    footer = f"({shown} rows shown; more rows were cut)" if more else f"({shown} rows)"
    return "\n".join([*lines, footer])
