"""Does the rise come from the GRPO updates? The demo job twice, the same rollouts and validations, once with
``actor.optim.lr=0`` (a control: the LoRA adapter stays zero, so the policy never changes).

    python -m benchmarks.learning_control [--steps 10] [dotted.key=value ...]

Prepares what ``make demo`` prepares (cached: model, data, SFT cold start), then runs ``apps.train`` on
``configs/demo_cpu.yaml`` for ``--steps`` GRPO steps with held-out greedy validation before and after, and prints
one line per run: each data source's ``val-core/…/acc/mean@1`` before → after and the overall accuracy. The verdict
is computed from the numbers: GRPO's overall Δ ≥ +0.15 and the control's |Δ| < 0.03.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from configs import load_config

GOAL = "held-out acc: GRPO delta >= +0.15, lr=0 control |delta| < 0.03"

GOAL_DELTA, CONTROL_LIMIT = 0.15, 0.03


def _validations(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if any(k.startswith("val-core/") for k in row)]


def _overall(row: dict[str, float], sizes: dict[str, int]) -> float:
    """Sample-weighted accuracy over the data sources (``sizes``: validation rows per source)."""
    keys = {k.removeprefix("val-core/").rsplit("/", 2)[0]: k for k in row if k.startswith("val-core/") and "/acc/mean@" in k}
    return sum(row[k] * sizes[s] for s, k in keys.items()) / sum(sizes[s] for s in keys)


def run_once(config: str, overrides: list[str], name: str, lr: float | None, steps: int) -> list[dict[str, float]]:
    from apps.train import run

    extra = [f"trainer.experiment_name={name}", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
             "trainer.val_before_train=true", "trainer.resume_mode=disable", "trainer.save_freq=-1",
             f"trainer.validation_data_dir=runs/{name}/validation", "trainer.log_val_generations=0"]
    if lr is not None:
        extra.append(f"actor_rollout_ref.actor.optim.lr={lr}")
    cfg = load_config(config, [*overrides, *extra])
    shutil.rmtree(cfg.trainer.run_dir, ignore_errors=True)
    with contextlib.redirect_stdout(io.StringIO()):  # the runs' own tables; this script prints one line each
        run(cfg)
    return _validations(Path(cfg.trainer.run_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps per run")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from apps import demo

    cfg = load_config(args.config, args.overrides)
    demo.prepare_base_model(Path(cfg.sft.base_model))
    demo.cold_start(cfg, demo.write_data(cfg, cfg.trainer.seed))
    from agents.data.rows import load_rows

    sizes: dict[str, int] = {}
    for path in cfg.data.val_paths:
        for row in load_rows(path):
            sizes[row.data_source] = sizes.get(row.data_source, 0) + 1
    results = {}
    for label, lr in ((f"GRPO lr={cfg.actor_rollout_ref.actor.optim.lr:g}", None), ("control lr=0", 0.0)):
        started = time.perf_counter()
        name = "learning-control-grpo" if lr is None else "learning-control-lr0"
        vals = run_once(args.config, args.overrides, name, lr, args.steps)
        before, after = vals[0], vals[-1]
        if int(before["step"]) != 0 or int(after["step"]) != args.steps:
            raise RuntimeError(f"{label}: validations at steps {[int(v['step']) for v in vals]}, expected 0 and {args.steps}")
        per_source = []
        for key in sorted(k for k in before if k.startswith("val-core/") and "/acc/mean@" in k):
            source = key.removeprefix("val-core/").rsplit("/", 2)[0]
            per_source.append(f"{source} {before[key]:.3f} → {after[key]:.3f}")
        delta = _overall(after, sizes) - _overall(before, sizes)
        results[label] = delta
        print(f"{label:>16}: held-out greedy acc@1 {'; '.join(per_source)}; overall {_overall(before, sizes):.3f} → "
              f"{_overall(after, sizes):.3f} (Δ {delta:+.3f}) after {args.steps} steps, "
              f"{time.perf_counter() - started:.0f}s", flush=True)
    grpo, control = results.values()
    ok = grpo >= GOAL_DELTA and abs(control) < CONTROL_LIMIT
    print(f"verdict: {'PASS' if ok else 'FAIL'} (GRPO Δ {grpo:+.3f} vs goal ≥ +{GOAL_DELTA}; control |Δ| {abs(control):.3f} "
          f"vs limit < {CONTROL_LIMIT})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
