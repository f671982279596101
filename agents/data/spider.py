"""Spider (or any dataset laid out like it) as ``tool_agent`` SQL rows (agents layer: pure, stdlib + rows).

A Spider folder holds ``tables.json`` (per database: ``db_id``, ``table_names_original``), question files
(``train_spider.json`` — plus ``train_others.json`` when present — for training, ``dev.json`` for
validation; each a list of ``{"db_id", "question", "query"}``) and ``database/<db_id>/<db_id>.sqlite``.
A question whose gold query fails or returns no rows on its database cannot be scored by execution: it is
not written as a row but listed, with the reason, in the ``skipped`` part of the result.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from agents.data.rows import DataError, DatasetRow
from agents.data.sql_tasks import SqlTask, sql_row

SPLIT_FILES = {"train": ("train_spider.json", "train_others.json"), "val": ("dev.json",)}


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot read it as JSON ({exc})") from None


def _gold_problem(db_path: Path, sql: str) -> str | None:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return None if conn.execute(sql).fetchmany(1) else "gold query returns no rows"
    except sqlite3.Error as exc:
        return f"gold query fails: {exc}"
    finally:
        conn.close()


def spider_splits(folder: Path) -> dict[str, Any]:
    """``{"train": rows, "val": rows, "skipped": [{"file", "item", "db_id", "reason"}]}`` from a Spider folder."""
    tables = {t["db_id"]: t for t in _load_json(folder / "tables.json")}
    out: dict[str, Any] = {"train": [], "val": [], "skipped": []}
    for split, names in SPLIT_FILES.items():
        files = [folder / name for name in names if (folder / name).is_file()]
        if not files:
            raise DataError(f"{folder}: no {' or '.join(names)} for the {split} split")
        for path in files:
            for item_no, item in enumerate(_load_json(path)):
                missing = [k for k in ("db_id", "question", "query") if k not in item]
                if missing:
                    raise DataError(f"{path} item {item_no}: missing key(s) {missing}")
                db_id = item["db_id"]
                db_path = folder / "database" / db_id / f"{db_id}.sqlite"
                if db_id not in tables or not db_path.is_file():
                    raise DataError(f"{path} item {item_no}: database {db_id!r} is not in tables.json or {db_path}")
                problem = _gold_problem(db_path, item["query"])
                if problem:
                    out["skipped"].append({"file": path.name, "item": item_no, "db_id": db_id, "reason": problem})
                    continue
                description = "tables " + ", ".join(tables[db_id]["table_names_original"])
                task = SqlTask(db_id, item["question"], item["query"], data_source=f"spider/{db_id}",
                               description=description)
                out[split].append(sql_row(task, db_path.resolve(), len(out[split]), split))
    return out
