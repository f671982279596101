"""Text-to-SQL reward by execution match (agents layer: pure, stdlib only).

The gold and the predicted query both run through ``agents.tools.sql.run_readonly_query`` on the
row's database. They match when their results are equal as multisets of rows; row order counts only
when the gold query has a top-level ORDER BY. Numbers compare with a small tolerance (an int equals
the float with the same value: ``SUM`` vs ``TOTAL``); column names do not matter, column order does.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agents.tools.sql import SqlResult, run_readonly_query

_FENCE = re.compile(r"```[ \t]*([A-Za-z]*)[^\n]*\n(.*?)```", re.DOTALL)
_SQL_TOKEN = re.compile(
    r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|\[[^\]]*\]"""  # quoted strings and identifiers
    r"""|--[^\n]*|/\*.*?(?:\*/|$)"""  # comments
    r"""|[A-Za-z_][\w$]*|[()]|[^\s]""",  # words, parentheses, any other character
    re.DOTALL,
)
_FAST_PATH_DIGITS = 9
_MAX_GREEDY_ROWS = 2_000  # the O(n^2) tolerant matcher runs only below this


def extract_sql(solution_str: str) -> str:
    """The last ```sql fenced block, else the last fenced block, else the whole text."""
    blocks = _FENCE.findall(solution_str)
    sql_blocks = [body for lang, body in blocks if lang.lower() == "sql"]
    chosen = sql_blocks or [body for _, body in blocks]
    return (chosen[-1] if chosen else solution_str).strip()


def has_top_level_order_by(query: str) -> bool:
    """True when ORDER BY appears outside every parenthesis (so it orders the final result)."""
    depth = 0
    words: list[str] = []
    for token in _SQL_TOKEN.findall(query):
        if token == "(":
            depth += 1
        elif token == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and (token[0].isalpha() or token[0] == "_"):
            words.append(token.upper())
        elif depth == 0 and not token.startswith(("--", "/*")):
            words.append(token)
    return any(a == "ORDER" and b == "BY" for a, b in zip(words, words[1:]))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cells_close(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    if _is_number(a) and _is_number(b):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=abs_tol)
    return type(a) is type(b) and a == b


def _rows_close(a: Sequence[Any], b: Sequence[Any], rel_tol: float, abs_tol: float) -> bool:
    return len(a) == len(b) and all(_cells_close(x, y, rel_tol, abs_tol) for x, y in zip(a, b))


def _canonical(row: Sequence[Any]) -> tuple[Any, ...]:
    # Numbers rounded to a few significant digits so nearly-equal floats usually hash together.
    return tuple(
        ("n", float(f"{float(v):.{_FAST_PATH_DIGITS}g}")) if _is_number(v) else (type(v).__name__, v)
        for v in row
    )


def _signature(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple("#" if _is_number(v) else (type(v).__name__, v) for v in row)


Rows = Sequence[Sequence[Any]]


def _multiset_close(gold: Rows, pred: Rows, rel_tol: float, abs_tol: float) -> bool:
    if Counter(map(_canonical, gold)) == Counter(map(_canonical, pred)):
        return True
    if len(gold) > _MAX_GREEDY_ROWS:
        return False
    # Slow path for floats that straddle a rounding boundary: greedy matching within rows that
    # agree on every non-numeric cell.
    buckets: dict[tuple[Any, ...], list[Sequence[Any]]] = defaultdict(list)
    for row in pred:
        buckets[_signature(row)].append(row)
    for row in gold:
        candidates = buckets[_signature(row)]
        hit = next((i for i, c in enumerate(candidates) if _rows_close(row, c, rel_tol, abs_tol)), None)
        if hit is None:
            return False
        candidates.pop(hit)
    return True


def results_match(
    gold: SqlResult, pred: SqlResult, *, ordered: bool, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """Whether two successful results hold the same rows (in the same order when ``ordered``)."""
    if pred.error is not None or pred.truncated or len(gold.rows) != len(pred.rows):
        return False
    if len(gold.columns) != len(pred.columns):
        return False
    if ordered:
        return all(_rows_close(g, p, rel_tol, abs_tol) for g, p in zip(gold.rows, pred.rows))
    return _multiset_close(gold.rows, pred.rows, rel_tol, abs_tol)


def score(
    solution_str: str,
    ground_truth: str,
    *,
    db_path: str | Path,
    timeout_s: float = 5.0,
    max_rows: int = 10_000,
    max_result_bytes: int = 64_000_000,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-9,
) -> float:
    """1.0 when the predicted SQL (``solution_str``, fenced or bare) returns the gold query's result.

    A predicted query that fails, times out or overflows ``max_rows``/``max_result_bytes`` scores 0.0;
    a gold query that does is a dataset bug and raises ``ValueError``.
    """
    limits = {"timeout_s": timeout_s, "max_rows": max_rows, "max_result_bytes": max_result_bytes}
    gold = run_readonly_query(db_path, ground_truth, **limits)
    if gold.error is not None:
        raise ValueError(f"gold SQL failed on {db_path}: {gold.error} (query: {ground_truth!r})")
    if gold.truncated:
        raise ValueError(
            f"gold SQL result exceeds max_rows={max_rows} or max_result_bytes={max_result_bytes} "
            f"on {db_path}: {ground_truth!r}"
        )
    pred = run_readonly_query(db_path, extract_sql(solution_str), **limits)
    ordered = has_top_level_order_by(ground_truth)
    return 1.0 if results_match(gold, pred, ordered=ordered, rel_tol=rel_tol, abs_tol=abs_tol) else 0.0
