"""``ray job submit --working-dir . -- python -m apps.train …`` on a cluster from ``ray start --head``.

The cluster is this test's own (tests/ray_head.py) with token auth on, as Ray 2.60 sets up local clusters;
the token comes from ``RAY_AUTH_TOKEN`` so ``~/.ray`` is left alone. The job runs in the uploaded copy of
the repo, which has none of the git-ignored inputs: model, data and outputs live under a separate root
named with ``--root``, all given as relative paths. Two jobs run one after the other, as on a long-lived
cluster: the second deploys the rollout app again under the same name and starts at policy version 0.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row, write_parquet
from tests.ray_head import BIN, free_port, ray_head

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def job_root(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A directory outside the repo with the job's inputs: ``model/`` and ``data/train.parquet``."""
    root = tmp_path / "root"
    shutil.copytree(tiny_model_dir, root / "model")
    rows = [validate_row(r, f"row {i}") for i, r in enumerate(arithmetic.make_rows(16, seed=3, split="train"))]
    write_parquet(rows, root / "data" / "train.parquet")
    return root


def _submit(head, job_root: Path, submission_id: str, run: str) -> subprocess.CompletedProcess:
    entrypoint = [
        "python", "-m", "apps.train", "--config", "configs/demo_cpu.yaml", "--root", str(job_root),
        "actor_rollout_ref.model.path=model", "data.train_files=data/train.parquet", "data.val_files=null",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.validation_data_dir=null",
        f"trainer.default_local_dir=runs/{run}", "tracking.mlflow_tracking_uri=sqlite:///mlruns.db",
        "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "data.max_response_length=32", f"serve.port={free_port()}",
    ]
    return subprocess.run(
        [BIN / "ray", "job", "submit", "--address", head.dashboard, "--submission-id", submission_id,
         "--working-dir", ".", "--", *entrypoint],
        cwd=ROOT, env=head.env, capture_output=True, text=True, timeout=600,
    )


def test_ray_job_submit_trains_twice_on_one_cluster(tmp_path, job_root):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    # The job's `python` is the first on the cluster's PATH: this venv's.
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY_AUTH_MODE="token",
               RAY_AUTH_TOKEN=secrets.token_hex(32))
    with ray_head(tmp_path / "ray_start.log", num_cpus=8, env=env, cwd=ROOT) as head:
        for attempt in (1, 2):
            submission_id = f"tandem-job-{attempt}-{secrets.token_hex(3)}"
            proc = _submit(head, job_root, submission_id, run=f"job-{attempt}")
            assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
            status = subprocess.run([BIN / "ray", "job", "status", "--address", head.dashboard, submission_id],
                                    env=env, capture_output=True, text=True, timeout=60)
            assert f"Job '{submission_id}' succeeded" in status.stdout, status.stdout + status.stderr
            run_dir = job_root / "runs" / f"job-{attempt}"
            [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert (int(step["step"]), int(step["policy_version"])) == (1, 1)
            assert (run_dir / "adapters" / "v1" / "adapter_model.safetensors").is_file()
            assert "weight sync: replica" in proc.stdout  # the driver's own log reaches the job's log
    assert (job_root / "mlruns.db").is_file()
