"""Prepare GSM8K-style math rows in verl's format (apps layer: entry point).

    python -m apps.prepare_gsm8k --out data/gsm8k [--source reasoning_gym|hub|FILE.jsonl|FILE.parquet]
        [--agent-name tool_agent] [--train N --val M] [--seed 0] [--gym-datasets gsm_symbolic,...]

Sources: ``reasoning_gym`` (default; offline, deterministic for a seed, ``data_source`` names the
generator, e.g. ``reasoning_gym/gsm_symbolic``), ``hub`` (``openai/gsm8k`` via ``datasets``, only when
the hub is reachable), or a local GSM8K file with ``question`` and ``answer`` (``... #### 72``) per row,
whose first N rows become train and the next M val. Writes ``train.parquet`` and ``val.parquet``.
"""

from __future__ import annotations

import argparse
import json
import time
import typing
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agents.data.gsm8k import (
    AgentName,
    GymDataset,
    MathProblem,
    math_rows,
    problems_from_gsm8k_records,
    problems_from_reasoning_gym,
)
from agents.data.rows import DataError, write_parquet

GYM_DATASETS: tuple[str, ...] = typing.get_args(GymDataset)
DEFAULT_TRAIN, DEFAULT_VAL = 256, 64
Splits = dict[str, list[MathProblem]]


def read_records(path: Path) -> list[dict[str, Any]]:
    """Rows of a local ``.jsonl`` or ``.parquet`` file as dicts; bad JSON names file and line."""
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    if path.suffix != ".jsonl":
        raise DataError(f"{path}: expected a .jsonl or .parquet file")
    records = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                where = f"{path} row {len(records)} (line {line_no})"
                raise DataError(f"{where}: invalid JSON: {exc.msg}") from None
    return records


def _take(problems: list[MathProblem], n_train: int | None, n_val: int, where: str) -> Splits:
    if n_val >= len(problems):
        raise DataError(f"{where}: {len(problems)} rows, not enough for {n_val} validation rows")
    n_train = len(problems) - n_val if n_train is None else n_train
    if n_train + n_val > len(problems):
        raise DataError(f"{where}: {len(problems)} rows, fewer than --train {n_train} + --val {n_val}")
    return {"train": problems[:n_train], "val": problems[n_train : n_train + n_val]}


def load_problems(
    source: str, n_train: int | None, n_val: int, seed: int, gym: list[GymDataset]
) -> Splits:
    """Train/val problems from the named source (see the module docstring)."""
    if source == "reasoning_gym":
        n_train = DEFAULT_TRAIN if n_train is None else n_train
        return _take(problems_from_reasoning_gym(gym, n_train + n_val, seed), n_train, n_val, source)
    if source == "hub":
        import datasets  # only this path needs it, and only with a reachable hub

        hub = datasets.load_dataset("openai/gsm8k", "main")
        train = problems_from_gsm8k_records(list(hub["train"]), "openai/gsm8k train")
        val = problems_from_gsm8k_records(list(hub["test"]), "openai/gsm8k test")
        return {"train": train[:n_train] if n_train else train, "val": val[:n_val]}
    path = Path(source)
    if not path.is_file():
        raise DataError(f"--source {source!r}: not reasoning_gym, hub, or an existing file")
    return _take(problems_from_gsm8k_records(read_records(path), str(path)), n_train, n_val, str(path))


def main(argv: list[str] | None = None) -> None:
    """Command line: write each split of the chosen source to ``--out/<split>.parquet``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/gsm8k"), help="output folder")
    parser.add_argument(
        "--source", default="reasoning_gym", help="reasoning_gym | hub | FILE.jsonl | FILE.parquet"
    )
    parser.add_argument("--agent-name", choices=typing.get_args(AgentName), default="tool_agent")
    parser.add_argument("--train", type=int, default=None, help=f"train rows (reasoning_gym: {DEFAULT_TRAIN})")
    parser.add_argument("--val", type=int, default=DEFAULT_VAL, help="validation rows")
    parser.add_argument("--seed", type=int, default=0, help="reasoning-gym seed")
    parser.add_argument("--gym-datasets", default="gsm_symbolic",
                        help=f"comma-separated reasoning-gym generators from {', '.join(GYM_DATASETS)}")
    args = parser.parse_args(argv)
    gym = [name.strip() for name in args.gym_datasets.split(",") if name.strip()]
    unknown = sorted(set(gym) - set(GYM_DATASETS))
    if unknown:
        parser.error(f"unknown --gym-datasets {unknown}; choose from {', '.join(GYM_DATASETS)}")
    start = time.perf_counter()
    splits = load_problems(args.source, args.train, args.val, args.seed, gym)  # type: ignore[arg-type]
    for split, problems in splits.items():
        path = write_parquet(math_rows(problems, split, args.agent_name), args.out / f"{split}.parquet")
        print(f"{split}: {len(problems)} rows -> {path}")
    print(f"prepared GSM8K data in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
