"""Chaos: one streaming training job per fault, each fault injected once, a table row per fault (benchmarks).

    python -m benchmarks.chaos [--steps 14] [--fault-step 4] [--only FAULT ...]

Each job is ``python -m apps.train`` on the tiny model (its own local Ray cluster, as a user starts it), the demo
config with short responses. Once the learner has finished ``--fault-step`` steps, the fault is injected into a
process of that job's own cluster (found among the job's descendant processes by Ray's process title):

* ``replica``: ``kill -9`` one of two rollout replicas (Serve starts a new one; its requests go elsewhere);
* ``train_worker``: ``kill -9`` the Ray Train worker, with ``trainer.max_failures=2`` and a checkpoint every
  3 steps (``--fault-step`` - 1 in shorter runs);
* ``agent_worker``: ``kill -9`` one of two agent workers;
* ``over_asked``: no kill; two replicas of 0.5 CPU, the ingress and the learner on a 2-CPU box;
* ``sigint``: Ctrl-C to the job, then the same command again (it resumes from the checkpoint);
* ``sigterm``: ``kill -TERM`` to the job (what ``ray job stop`` and a pod's shutdown send), then the same command
  again: exit 143, then a resumed run that finishes.

Row: fault, exit code(s), steps done, groups trained / failed / retried (re-dispatched groups and re-sent
generates), log lines naming the fault, wall seconds, verdict computed from the row against the fault's goal.
Last line: ``chaos: N/M faults meet their goal PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = "every injected fault meets its goal (exit code, steps, failed groups, log lines)"
FAULTS = ("replica", "train_worker", "agent_worker", "over_asked", "sigint", "sigterm")
STOPS = {"sigint": 130, "sigterm": 143}  # faults that stop the job: its exit code, then a relaunch must finish
APP = "chaos"
# Ray's process titles of the parts a fault kills
TITLES = {"replica": f"ServeReplica:{APP}:RolloutServer", "train_worker": "RayTrainWorker",
          "agent_worker": "AgentWorkerImpl"}
# what a log line that names the fault looks like
MENTIONS = {"replica": r"ActorDiedError|RayActorError|replica .*died|ActorUnavailable",
            "train_worker": r"RayTrainWorker|learner restarted|restarted from the step|WorkerGroup|worker group",
            "agent_worker": r"AgentWorker|agent worker",
            "over_asked": r"does not fit the cluster|CPUs asked",
            "sigint": r"interrupted|KeyboardInterrupt|resum",
            "sigterm": r"SIGTERM|resum"}


@dataclass
class Outcome:
    fault: str
    codes: list[int] = field(default_factory=list)
    steps: int = 0
    total_steps: int = 0
    trained: int = 0
    failed: int = 0
    retried: int = 0
    mentions: int = 0
    wall_s: float = 0.0
    versions: list[int] = field(default_factory=list)
    checkpoint: bool = False
    resumed_from: int = 0
    injected: bool = False
    output: str = ""

    def verdict(self) -> tuple[bool, str]:
        """Whether every injected fault's goal is met, and the goals (a job that ends with Ctrl-C exits 130 and its
        relaunch 0; the other faults' goals hold in the first launch)."""
        faults = self.fault.split("+")
        if faults == ["over_asked"]:
            return (self.codes[:1] != [0] and self.wall_s < 60 and "CPUs asked" in self.output,
                    "non-zero exit within 60 s naming CPUs asked vs available")
        full = self.steps == self.total_steps
        if faults[-1] in STOPS:
            code = STOPS[faults[-1]]
            ok, goals = self.codes == [code, 0] and full, [f"exit {code}, the rerun finishes"]
        else:
            ok, goals = self.codes == [0] and full, ["exit 0, all steps"]
        ok = ok and self.injected
        for fault in faults:
            if fault == "replica":
                ok, goals = ok and self.failed == 0, goals + ["0 failed"]
            elif fault == "train_worker":
                rising = all(b > a for a, b in zip(self.versions, self.versions[1:]))
                ok, goals = ok and rising, goals + ["policy versions strictly increasing"]
            elif fault == "agent_worker":
                # its groups are re-dispatched, so none should fail (stricter than "failed <= groups it held")
                ok = ok and self.failed == 0 and self.mentions < 100
                goals.append("0 failed (its groups re-dispatched), < 100 log lines")
            elif fault in STOPS:
                ok, goals = ok and self.checkpoint and self.resumed_from > 0, goals + ["checkpoint on disk, resumed"]
        return ok, ", ".join(goals)


def command(run_dir: Path, model: Path, rows: Path, steps: int, save_freq: int, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "apps.train", "--config", "configs/demo_cpu.yaml",
        f"actor_rollout_ref.model.path={model}", f"data.train_files={rows}", "data.val_files=null",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.validation_data_dir=null",
        f"trainer.total_training_steps={steps}", f"trainer.save_freq={save_freq}",
        f"trainer.default_local_dir={run_dir}", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "data.max_response_length=48", "sft.enabled=false",
        f"tracking.mlflow_tracking_uri=sqlite:///{run_dir.parent / 'mlruns.db'}", f"serve.app_name={APP}",
        "serve.port=8127", *extra,
    ]


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid`` (Ray's processes of the job's own local cluster)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            args = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        found.append((child, args))
        todo.extend(children.get(child, []))
    return found


def learner_steps(run_dir: Path) -> int:
    path = run_dir / "learner_metrics.jsonl"
    if not path.is_file():
        return 0
    return max((int(json.loads(line)["step"]) for line in path.read_text().splitlines() if line.strip()), default=0)


def _start(cmd: list[str], log_path: Path) -> subprocess.Popen:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    # Ctrl-C reaches a job started in the foreground; a harness itself started in the background (``make bench &``)
    # would hand its children SIGINT ignored, and the job would finish as if never interrupted.
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_path.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=_sigint_default)  # noqa: PLW1509 - no threads here


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def inject(fault: str, proc: subprocess.Popen) -> bool:
    """Kill one process of the fault's kind (or Ctrl-C the job). True when something was hit."""
    if fault in STOPS:
        proc.send_signal(signal.SIGINT if fault == "sigint" else signal.SIGTERM)
        return True
    title = TITLES[fault]
    victims = [pid for pid, args in descendants(proc.pid) if title in args]
    if not victims:
        return False
    os.kill(victims[0], signal.SIGKILL)
    return True


def run_fault(fault: str, work: Path, model: Path, rows: Path, *, steps: int, fault_step: int,
              timeout_s: float = 900.0) -> Outcome:
    """Run the job once with ``fault`` injected after ``fault_step`` learner steps; the row's numbers."""
    return run_faults([(fault, fault_step)], work, model, rows, steps=steps, timeout_s=timeout_s)


def run_faults(faults: list[tuple[str, int]], work: Path, model: Path, rows: Path, *, steps: int,
               timeout_s: float = 900.0) -> Outcome:
    """One job with each ``(fault, step)`` injected in turn, once the learner has finished that many steps (a
    ``sigint`` last: the job is then launched again and must finish). The row's numbers, ``versions`` from the
    first launch (a relaunch restarts its numbering at the checkpoint's version)."""
    names = [fault for fault, _ in faults]
    if any(n in STOPS for n in names[:-1]) or ("over_asked" in names and len(faults) > 1):
        raise ValueError(f"{names}: sigint/sigterm can only come last, and over_asked only alone")
    name = "+".join(names)
    run_dir = work / name / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    save_freq = min(3 if step > 3 else max(1, step - 1) for _, step in faults)
    extras = {"replica": ["serve.min_replicas=2", "serve.max_replicas=2", "serve.num_cpus_per_replica=0.4"],
              "train_worker": ["trainer.max_failures=2"],
              "agent_worker": ["actor_rollout_ref.rollout.agent.num_workers=2"],
              "over_asked": ["serve.min_replicas=2", "serve.max_replicas=2", "serve.num_cpus_per_replica=0.5"],
              "sigint": [], "sigterm": []}
    cmd = command(run_dir, model, rows, steps, save_freq, [arg for fault in names for arg in extras[fault]])
    out = Outcome(name, total_steps=steps)
    started = time.perf_counter()
    logs = [run_dir.parent / "job.log"]
    proc = _start(cmd, logs[0])
    deadline = time.monotonic() + timeout_s
    hits = []
    for fault, fault_step in faults:
        if fault == "over_asked":
            continue
        while proc.poll() is None and learner_steps(run_dir) < fault_step and time.monotonic() < deadline:
            time.sleep(0.2)
        hits.append(proc.poll() is None and inject(fault, proc))
    out.injected = bool(hits) and all(hits)
    out.codes.append(_wait(proc, timeout_s))
    out.versions = [int(row["policy_version"]) for row in _train_rows(run_dir)]
    if names[-1] in STOPS:
        out.checkpoint = any((run_dir / "ray_train").glob("*/step_*/state.pt"))
        logs.append(run_dir.parent / "rerun.log")
        rerun = _start(cmd, logs[1])
        out.codes.append(_wait(rerun, timeout_s))
        match = re.search(r"resuming from the step-(\d+) checkpoint", logs[1].read_text())
        out.resumed_from = int(match.group(1)) if match else 0
    out.wall_s = time.perf_counter() - started
    out.output = "\n".join(path.read_text(errors="replace") for path in logs)
    out.mentions = sum(any(re.search(MENTIONS[fault], line) for fault in names) for line in out.output.splitlines())
    train = _train_rows(run_dir)
    out.steps = max((int(row["step"]) for row in train), default=0)
    book = run_dir / "accounting.json"
    if book.is_file():
        counts = json.loads(book.read_text())
        out.trained, out.failed = int(counts["groups/trained"]), int(counts["groups/failed"])
    if train:
        out.retried = int(train[-1].get("groups/redispatched", 0) + train[-1].get("rollout/generate_retries", 0))
    return out


def _train_rows(run_dir: Path) -> list[dict]:
    """The training steps' rows of ``metrics.jsonl`` (those with a policy version)."""
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return [row for row in rows if "policy_version" in row]


def table(outcomes: list[Outcome]) -> str:
    head = f"{'fault':13s} {'exit':>7s} {'steps':>6s} {'trained':>7s} {'failed':>6s} {'retried':>7s} " \
           f"{'mentions':>8s} {'wall s':>7s}  verdict (goal)"
    lines = [head]
    for o in outcomes:
        ok, goal = o.verdict()
        lines.append(f"{o.fault:13s} {'/'.join(map(str, o.codes)):>7s} {o.steps:>3d}/{o.total_steps:<2d} {o.trained:>7d} "
                     f"{o.failed:>6d} {o.retried:>7d} {o.mentions:>8d} {o.wall_s:>7.0f}  "
                     f"{'PASS' if ok else 'FAIL'} ({goal}{'' if o.injected or o.fault == 'over_asked' else '; not injected'})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--fault-step", type=int, default=4)
    parser.add_argument("--only", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs and logs here")
    args = parser.parse_args(argv)
    from agents.data import arithmetic
    from agents.data.rows import validate_row, write_parquet
    from apps.make_tiny_model import build_tiny_model

    work = args.keep or Path(tempfile.mkdtemp(prefix="chaos_"))
    model = build_tiny_model(work / "model", seed=0)
    rows = work / "train.parquet"
    write_parquet([validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(64, seed=3, split="train"))],
                  rows)
    outcomes = []
    for fault in args.only:
        outcome = run_fault(fault, work, model, rows, steps=args.steps, fault_step=args.fault_step)
        outcomes.append(outcome)
        print(table([outcome]).splitlines()[1], flush=True)
    print(table(outcomes))
    met = sum(o.verdict()[0] for o in outcomes)
    print(f"logs and runs: {work}")
    print(f"chaos: {met}/{len(outcomes)} faults meet their goal {'PASS' if met == len(outcomes) else 'FAIL'}")
    return 0 if met == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
