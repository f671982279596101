"""Does the rise come from the GRPO updates? The demo job twice, the same rollouts and validations, once with
``actor.optim.lr=0`` (a control: the LoRA adapter stays zero, so the policy never changes).

    python -m benchmarks.learning_control [--task arithmetic|sql] [--steps N] [dotted.key=value ...]

``--task arithmetic`` (default) prepares what ``make demo`` prepares (cached: model, data, SFT cold start) and runs
``apps.train`` on ``configs/demo_cpu.yaml``; the verdict: overall held-out Δ ≥ +0.15 and the control's |Δ| < 0.03.
``--task sql`` prepares what ``make demo-sql`` prepares (Qwen2.5-Coder-0.5B, the SQL families) and runs
``configs/sql_cpu.yaml``; the verdict is on the held-out-family set (families never trained on): Δ ≥ +0.10 and the
control's |Δ| < 0.03, with the same-family set printed beside it. Each run validates greedily before and after
``--steps`` GRPO steps and prints one line: each data source's ``val-core/…/acc/mean@1`` before → after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from configs import load_config

GOAL = "held-out acc: GRPO delta >= +0.15, lr=0 control |delta| < 0.03"

GOAL_DELTA, CONTROL_LIMIT = 0.15, 0.03
# --task sql: the verdict's metric is the held-out-family group; the same-family group is reported beside it
SQL_GOAL_DELTA = 0.10
SQL_HEADLINE, SQL_BESIDE = "sql/heldout_family", "sql/same_family"
TASKS = {"arithmetic": "configs/demo_cpu.yaml", "sql": "configs/sql_cpu.yaml"}


def validations(run_dir: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if any(k.startswith("val-core/") for k in row)]


def overall(row: dict[str, float], sizes: dict[str, int]) -> float:
    """Sample-weighted accuracy over the data sources (``sizes``: validation rows per source; each source's
    figure as ``core`` reads it)."""
    sources = [s for s in sizes if any(k.startswith(f"val-core/{s}/") for k in row)]
    return sum(core(row, s) * sizes[s] for s in sources) / sum(sizes[s] for s in sources)


def job_overrides(name: str, steps: int) -> list[str]:
    """A measured run's keys: its own name and folder, ``steps`` GRPO steps, greedy validation before and after only,
    a fresh start (no resume, no checkpoints)."""
    return [f"trainer.experiment_name={name}", f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}",
            "trainer.val_before_train=true", "trainer.resume_mode=disable", "trainer.save_freq=-1",
            f"trainer.validation_data_dir=runs/{name}/validation", "trainer.log_val_generations=0"]


def run_once(config: str, overrides: list[str], name: str, lr: float | None, steps: int) -> list[dict[str, float]]:
    from apps.train import run

    extra = job_overrides(name, steps)
    if lr is not None:
        extra.append(f"actor_rollout_ref.actor.optim.lr={lr}")
    cfg = load_config(config, [*overrides, *extra])
    run_dir = Path(cfg.trainer.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    # the run's own console (progress lines, tables) goes to its folder; this script prints one line per run
    with open(run_dir / "console.log", "w", buffering=1) as console, contextlib.redirect_stdout(console):
        run(cfg)
    return validations(Path(cfg.trainer.run_dir))


def prepare(task: str, config: str, overrides: list[str]) -> dict[str, int]:
    """What the demo prepares (cached); returns validation rows per data source."""
    cfg = load_config(config, overrides)
    if task == "sql":
        from apps import demo_sql

        demo_sql.prepare_base_model(demo_sql.MODEL_SOURCE, Path(cfg.actor_rollout_ref.model.path))
        demo_sql.write_data(cfg, cfg.trainer.seed)
    else:
        from apps import demo

        demo.prepare_base_model(Path(cfg.sft.base_model))
        demo.cold_start(cfg, demo.write_data(cfg, cfg.trainer.seed))
    from agents.data.rows import load_rows

    sizes: dict[str, int] = {}
    for path in cfg.data.val_paths:
        for row in load_rows(path):
            sizes[row.data_source] = sizes.get(row.data_source, 0) + 1
    return sizes


def core(row: dict[str, float], source: str) -> float:
    """The source's headline validation figure: ``val-core/<source>/acc/mean@N``, or ``reward/mean@N`` for a reward
    without an ``acc`` key (the SQL reward: 0/1 execution match)."""
    for var in ("acc", "reward"):
        keys = [k for k in row if k.startswith(f"val-core/{source}/{var}/mean@")]
        if len(keys) == 1:
            return row[keys[0]]
    raise KeyError(f"no val-core/{source}/<acc|reward>/mean@N in the validation row at step {row.get('step')}")


def _finished(name: str, config: str, overrides: list[str], steps: int) -> list[dict[str, float]]:
    """The validations of a run already in its folder (``--runs`` left it out), checked to be this job's."""
    cfg = load_config(config, [*overrides, f"trainer.experiment_name={name}"])
    run_dir = Path(cfg.trainer.run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl: run {name} first (--runs)")
    return validations(run_dir)


AUX = (("val-aux/num_turns/mean", "turns/episode", "{:.2f}"),
       ("val-aux/tool_calls/mean", "tool calls/episode", "{:.2f}"),
       ("val-aux/tool_errors/mean", "tool errors fed back/episode", "{:.2f}"),
       ("val-aux/parse_errors/call_share", "unreadable tool calls (share of calls)", "{:.1%}"),
       ("val-aux/response_length/mean", "response tokens/episode", "{:.0f}"))


def sql_tables(config: str, overrides: list[str], steps: int) -> str:
    """The SQL task's per-family table (each family's accuracy before → after, both runs) and the episodes' shape
    (turns, tool calls, errors fed back, unreadable calls, length) before → after, read from the two run folders."""
    runs = {label: _finished(f"learning-control-sql-{name}", config, overrides, steps)
            for label, name in (("GRPO", "grpo"), ("control", "lr0"))}
    lines = [f"{'family':<44} {'GRPO before → after':>20} {'control before → after':>23}"]
    families = sorted({source for vals in runs.values() for source in _sources(vals[0]) if ":" in source})
    for family in families:
        cells = [f"{core(vals[0], family):.3f} → {core(vals[-1], family):.3f}" for vals in runs.values()]
        lines.append(f"{family:<44} {cells[0]:>20} {cells[1]:>23}")
    for key, label, fmt in AUX:
        cells = [f"{fmt.format(vals[0][key])} → {fmt.format(vals[-1][key])}" for vals in runs.values()]
        lines.append(f"{label:<44} {cells[0]:>20} {cells[1]:>23}")
    return "\n".join(lines)


def _sources(row: dict[str, float]) -> set[str]:
    return {k.removeprefix("val-core/").rsplit("/", 2)[0] for k in row if k.startswith("val-core/") and "/mean@" in k}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic")
    parser.add_argument("--config", default=None, help="default: the task's demo config")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps per run (default: arithmetic 10, sql: "
                        "the config's trainer.total_training_steps)")
    parser.add_argument("--runs", default="grpo,control",
                        help="which runs to start (comma-separated; none: only report); the others are read from their "
                             "run folders")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    wanted = set(args.runs.split(",")) - {"none"}
    if not wanted <= {"grpo", "control"}:
        raise SystemExit(f"--runs {args.runs!r}: expected grpo, control, both or none")
    logging.basicConfig(level=logging.WARNING)
    config = args.config or TASKS[args.task]
    steps = args.steps or (10 if args.task == "arithmetic" else load_config(config, args.overrides).trainer.total_training_steps)
    sizes = prepare(args.task, config, args.overrides)
    results = {}
    for label, lr in ((f"GRPO lr={load_config(config, args.overrides).actor_rollout_ref.actor.optim.lr:g}", None),
                      ("control lr=0", 0.0)):
        started = time.perf_counter()
        name = f"learning-control-{args.task}-{'grpo' if lr is None else 'lr0'}"
        if ("grpo" if lr is None else "control") in wanted:
            vals = run_once(config, args.overrides, name, lr, steps)
        else:
            try:
                vals = _finished(name, config, args.overrides, steps)
            except FileNotFoundError as exc:  # neither started nor on disk: this run's line says so, no verdict
                print(f"{label:>16}: not run ({exc})", flush=True)
                continue
            label += " (read from its run folder)"
        before, after = vals[0], vals[-1]
        if int(before["step"]) != 0 or int(after["step"]) != steps:
            raise RuntimeError(f"{label}: validations at steps {[int(v['step']) for v in vals]}, expected 0 and {steps}")
        if args.task == "sql":
            shown = [(source, core(before, source), core(after, source)) for source in (SQL_HEADLINE, SQL_BESIDE)]
            delta = shown[0][2] - shown[0][1]
            summary = f"headline {SQL_HEADLINE} Δ {delta:+.3f}"
        else:
            shown = []
            for key in sorted(k for k in before if k.startswith("val-core/") and "/acc/mean@" in k):
                source = key.removeprefix("val-core/").rsplit("/", 2)[0]
                shown.append((source, before[key], after[key]))
            delta = overall(after, sizes) - overall(before, sizes)
            summary = f"overall {overall(before, sizes):.3f} → {overall(after, sizes):.3f} (Δ {delta:+.3f})"
        results[label] = delta
        per_source = "; ".join(f"{source} {b:.3f} → {a:.3f}" for source, b, a in shown)
        print(f"{label:>16}: held-out greedy acc@1 {per_source}; {summary} after {steps} steps, "
              f"{time.perf_counter() - started:.0f}s", flush=True)
    if len(results) < 2:
        print("verdict: none (it needs both runs: start the missing one with --runs)")
        return 1
    if args.task == "sql":
        print(sql_tables(config, args.overrides, steps))
    grpo, control = results.values()
    goal = SQL_GOAL_DELTA if args.task == "sql" else GOAL_DELTA
    ok = grpo >= goal and abs(control) < CONTROL_LIMIT
    print(f"verdict: {'PASS' if ok else 'FAIL'} (GRPO Δ {grpo:+.3f} vs goal ≥ +{goal}; control |Δ| {abs(control):.3f} "
          f"vs limit < {CONTROL_LIMIT})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
