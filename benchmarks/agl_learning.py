"""Does an Agent Lightning agent learn on tandem-rl? The arithmetic demo's job (its model, cold start, rows, config and
GRPO steps), with the episodes run by an Agent Lightning 0.3.x agent under 0.3.x's own ``Trainer.fit`` and
``tandem_rl_agl.TandemRL`` as its algorithm (``integrations/agentlightning/examples/calculator_agent.py``: an OpenAI
tool-calling loop with its own calculator and reward, nothing of tandem-rl in it).

    python -m benchmarks.agl_learning [--steps N] [dotted.key=value ...]      (make bench-agl)

Prepares what ``make demo`` prepares (cached), makes ``.venv-agl03`` if it is missing, runs the agent's script with
that interpreter and reads tandem-rl's validations (greedy, before and after, through the same agent) from the run's
folder. Prints each data source's held-out accuracy before → after, the overall Δ and the wall time; the goal is the
demo's own (overall held-out Δ ≥ +0.15), which ``python -m benchmarks.learning_control`` measures for tandem-rl's
built-in tool agent on the same job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.learning_control import GOAL_DELTA, core, job_overrides, overall, prepare, validations
from configs import load_config

GOAL = f"held-out acc through an Agent Lightning agent: GRPO delta >= +{GOAL_DELTA}"
ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/demo_cpu.yaml"
NAME = "agl-learning"
AGENT = ROOT / "integrations" / "agentlightning" / "examples" / "calculator_agent.py"


def agl03_python() -> Path:
    """Agent Lightning 0.3.x's interpreter, with tandem-rl's algorithm installed (``make agl03-venv``)."""
    venv = ROOT / ".venv-agl03"
    subprocess.run(["bash", str(ROOT / "scripts" / "agl_venv.sh"), str(venv), "requirements/agentlightning03.txt",
                    "./integrations/agentlightning"], cwd=ROOT, check=True)
    return venv / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps (the demo's 10)")
    parser.add_argument("--runners", type=int, default=8, help="Agent Lightning runner processes")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    from tests.ray_head import free_port

    sizes = prepare("arithmetic", CONFIG, args.overrides)
    import ray

    ray.shutdown()  # the cold start's cluster, if it ran: the run starts its own
    cfg = load_config(CONFIG, args.overrides)
    python = agl03_python()
    overrides = [*args.overrides, *job_overrides(NAME, args.steps)]
    run_dir = Path(load_config(CONFIG, overrides).trainer.run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [str(python), str(AGENT), "--train", str(Path(cfg.data.train_paths[0]).with_suffix(".jsonl")),
               "--val", str(Path(cfg.data.val_paths[0]).with_suffix(".jsonl")), "--config", CONFIG,
               "--python", sys.executable, "--cwd", str(ROOT), "--serve-port", str(free_port()),
               "--store-port", str(free_port()), "--runners", str(args.runners), *overrides]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VIRTUAL_ENV")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm (imported by agentlightning) fetches a price list otherwise
    started = time.perf_counter()
    with open(run_dir / "console.log", "w") as console:  # the run's own console; this script prints the result
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=console, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(f"agl_learning: the Agent Lightning run exited with {done.returncode} after {wall:.0f}s; its output is in "
              f"{run_dir / 'console.log'}")
        return 1
    vals = validations(run_dir)
    before, after = vals[0], vals[-1]
    if int(before["step"]) != 0 or int(after["step"]) != args.steps:
        raise RuntimeError(f"validations at steps {[int(v['step']) for v in vals]}, expected 0 and {args.steps}")
    per_source = "; ".join(f"{source} {core(before, source):.3f} → {core(after, source):.3f}" for source in sorted(sizes))
    delta = overall(after, sizes) - overall(before, sizes)
    print(f"Agent Lightning agent, {args.steps} GRPO steps: held-out greedy acc@1 {per_source}; overall "
          f"{overall(before, sizes):.3f} → {overall(after, sizes):.3f} (Δ {delta:+.3f}), {wall:.0f}s wall")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [f"{s['reward/mean']:.2f}" for s in steps if "reward/mean" in s]
    print(f"  training reward/mean per step: {' '.join(rewards)}")
    ok = delta >= GOAL_DELTA
    print(f"agl_learning: overall held-out Δ {delta:+.3f} through an Agent Lightning agent "
          f"({'PASS' if ok else 'FAIL'}: goal ≥ +{GOAL_DELTA})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
