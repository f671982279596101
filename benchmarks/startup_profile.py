"""Where an ``apps.train`` run's start-up goes: from launch to the moment step 1 began, the console's milestones (Ray's
first daemon, Serve started, the rollout app ready) and the CPU seconds every process spent, by role, with the roles
whose processes loaded torch marked. A profile, no goal: the lever for the start-up that ``benchmarks.peer_trl``
counts against tandem-rl (Ray, Serve, model loads) and for each ``apps.train`` run of CI.

``python -m benchmarks.startup_profile`` runs the tests' short job (configs/demo_cpu.yaml, 2 groups of 2, 3 steps) on
the tiny model; ``--model .cache/sft-model`` on the demo's model; extra arguments are ``apps.train`` overrides. One
run at a time on an otherwise idle box: on 2 cores start-up is CPU-bound, so the CPU seconds are the profile and the
wall time follows from them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks.serve_load import CPU_ROLES

ROOT = Path(__file__).resolve().parents[1]

# First match wins: what a process's command line (Ray's process titles) says it is. The roles of a training run, then
# the serving roles benchmarks.serve_load names (Serve proxy and controller, ingress, rollout replica, Ray daemons).
ROLES = (
    ("apps.train", "driver"),
    ("RayTrainWorker", "learner worker"),
    ("TrainController", "Ray Train's actors"), ("PlacementGroupCleaner", "Ray Train's actors"),
    ("DatasetManager", "Ray Train's actors"), ("SynchronizationActor", "Ray Train's actors"),
    ("_AutoscalingCoordinatorActor", "Ray Train's actors"),
    ("AgentWorker", "agent workers"),
    ("AdapterPublisher", "tandem-rl's actors"), ("MetricsSink", "tandem-rl's actors"),
    ("TrajectoryBuffer", "tandem-rl's actors"), ("Coordinator", "tandem-rl's actors"),
    ("AdapterRegistry", "tandem-rl's actors"), ("SessionStore", "tandem-rl's actors"),
    # a Ray worker before it sets its title (it is then ray::IDLE, later the actor's name)
    ("ray::IDLE", "idle Ray workers"), ("default_worker.py", "idle Ray workers"),
    *CPU_ROLES,
)
# console lines that mark a stage: (text in the line, milestone)
MILESTONES = (("Started Serve", "Serve started"), ("is ready at", "rollout app ready"),
              ("GRPO steps:", "rows admitted"))  # the step bar opens once the coordinator admits rows


def role_of(cmdline: str) -> str:
    return next((name for key, name in ROLES if key in cmdline), "other")


def kept_role(old: str, new: str) -> str:
    """A Ray worker that ran an actor or task and went back to IDLE stays what it was."""
    return old if new == "idle Ray workers" else new


class Sampler:
    """Every new process's role (its latest known: a Ray worker starts as IDLE and becomes an actor), CPU seconds and
    whether it mapped libtorch, sampled every 0.25 s; ``at(t)`` is the last sample at or before ``t``."""

    def __init__(self, ignore: set[int]):
        self.ignore, self.samples = ignore, []  # [(seconds since start, {pid: (role, cpu_s, torch)})]
        self.started = time.time()
        self.running = True
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        import psutil

        known: dict[int, tuple[str, float, bool]] = {}
        while self.running:
            for proc in psutil.process_iter(["cmdline", "cpu_times"]):
                if proc.pid in self.ignore or proc.info["cpu_times"] is None:
                    continue
                role = role_of(" ".join(proc.info["cmdline"] or ()))
                old_role, _, torch = known.get(proc.pid, (role, 0.0, False))
                role = kept_role(old_role, role)
                if not torch:
                    try:
                        torch = "libtorch_cpu" in Path(f"/proc/{proc.pid}/maps").read_text()
                    except OSError:
                        pass
                known[proc.pid] = (role, proc.info["cpu_times"].user + proc.info["cpu_times"].system, torch)
            self.samples.append((time.time() - self.started, dict(known)))
            time.sleep(0.25)

    def stop(self) -> None:
        self.running = False
        self.thread.join()

    def at(self, t: float) -> dict[int, tuple[str, float, bool]]:
        before = [sample for when, sample in self.samples if when <= t]
        return before[-1] if before else {}


def cpu_by_role(sample: dict[int, tuple[str, float, bool]]) -> tuple[Counter, set[str]]:
    """CPU seconds by role, and the roles some of whose processes loaded torch."""
    used: Counter = Counter()
    torch_roles = set()
    for role, cpu_s, torch in sample.values():
        used[role] += cpu_s
        if torch:
            torch_roles.add(role)
    return used, torch_roles


def report(step1_s: float, milestones: dict[str, float], sample: dict[int, tuple[str, float, bool]],
           cores: int) -> list[str]:
    used, torch_roles = cpu_by_role(sample)
    total = sum(used.values())
    stages = ", ".join(f"{name} {t:.1f}s" for name, t in sorted(milestones.items(), key=lambda kv: kv[1]))
    parts = ", ".join(f"{role} {cpu:.1f}s{' (torch)' if role in torch_roles else ''}"
                      for role, cpu in used.most_common() if cpu >= 0.5)
    processes = sum(1 for role, cpu_s, _ in sample.values() if cpu_s >= 0.5)
    return [f"timeline: {stages}, step 1 began {step1_s:.1f}s",
            f"cpu until step 1 began: {total:.0f}s of {cores * step1_s:.0f}s ({cores} cores x {step1_s:.0f}s), "
            f"{processes} processes: {parts}",
            f"startup_profile: step 1 began {step1_s:.1f}s after launch; {total:.0f} CPU-seconds by then "
            f"({total / max(cores * step1_s, 1e-9):.0%} of the cores)"]


def run_job(cmd: list[str], log_path: Path, metrics: Path) -> tuple[int, dict[str, float], dict[int, float], Sampler]:
    """Run the job with every process sampled; its exit code, the console milestones (seconds from launch), when each
    step's metrics row landed (time.time()) and the sampler. Ctrl-C or an error here kills the job and its local Ray
    cluster (its process group)."""
    import psutil

    from benchmarks.peer_trl import RowClock

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}  # console lines stamped as they come
    env.pop("RAY_ADDRESS", None)
    sampler = Sampler({p.pid for p in psutil.process_iter()})
    clock = RowClock(metrics)
    milestones: dict[str, float] = {}
    code = -1
    with log_path.open("w") as log, subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                now = time.time() - sampler.started
                for text, name in MILESTONES:
                    if text in line:
                        milestones.setdefault(name, now)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            sampler.stop()
            landed = clock.stop()
    return code, milestones, landed, sampler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="model folder (default: the tiny test model, built in a temp dir)")
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("overrides", nargs="*", help="apps.train overrides, after the short job's")
    args = parser.parse_args(argv)
    from agents.data import arithmetic
    from agents.data.rows import validate_row, write_parquet

    out = Path(tempfile.mkdtemp(prefix="startup-profile-"))
    model = args.model.resolve() if args.model else None  # the job runs in the repository root
    if model is None:
        from apps.make_tiny_model import build_tiny_model

        model = build_tiny_model(out / "tiny", seed=0)
    rows = out / "train.parquet"
    write_parquet([validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(32, seed=3, split="train"))],
                  rows)
    run_dir = out / "run"
    cmd = [sys.executable, "-m", "apps.train", "--config", args.config, f"actor_rollout_ref.model.path={model}",
           f"data.train_files={rows}", "data.val_files=null", "trainer.val_before_train=false", "trainer.test_freq=-1",
           "trainer.validation_data_dir=null", "trainer.total_training_steps=3", "trainer.save_freq=-1",
           f"trainer.default_local_dir={run_dir}", "data.train_batch_size=2",
           "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
           "data.max_response_length=48", "sft.enabled=false",
           f"tracking.mlflow_tracking_uri=sqlite:///{out / 'mlruns.db'}", "serve.app_name=startup-profile",
           *args.overrides]
    code, milestones, landed, sampler = run_job(cmd, out / "train.log", run_dir / "metrics.jsonl")
    first_ray = next((when for when, sample in sampler.samples
                      if any(role == "Ray daemons" for role, _, _ in sample.values())), None)
    if first_ray is not None:
        milestones["Ray's first daemon"] = first_ray
    rows_ = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if line.strip()] if (run_dir / "metrics.jsonl").is_file() else []
    step1 = next((r for r in rows_ if int(r.get("step", 0)) == 1 and "policy_version" in r), None)
    if code != 0 or step1 is None or 1 not in landed:
        print(f"startup_profile: apps.train exited {code} before step 1 (log: {out / 'train.log'})")
        return 1
    # step 1 began when its row landed less its step time (as benchmarks.peer_trl counts start-up)
    step1_s = landed[1] - sampler.started - float(step1["timing/step_s"])
    print(f"run folder {out}")
    for line in report(step1_s, milestones, sampler.at(step1_s), os.cpu_count() or 1):
        print(line)  # the last line is the summary (benchmarks.run_all's table shows it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
