"""Checkpoint storage (trainers/storage.py): Ray Train's storage_path rules, and resuming from a URI."""

from __future__ import annotations

import json

import pytest
import torch

from configs import load_config
from trainers import storage
from trainers.trainer import resume_point

pytestmark = pytest.mark.unit


def _cfg(*overrides: str):
    return load_config("configs/demo_cpu.yaml", ["trainer.device=cpu", *overrides])


def test_the_default_is_the_run_dirs_ray_train_folder_and_a_uri_stays_a_uri(tmp_path):
    assert storage.checkpoint_root(_cfg(f"trainer.default_local_dir={tmp_path}").trainer) == str(tmp_path / "ray_train")
    assert storage.checkpoint_root(_cfg("trainer.storage_path=s3://bucket/runs").trainer) == "s3://bucket/runs"
    assert storage.local_folder("file:///mnt/nfs/runs") == storage.Path("/mnt/nfs/runs")
    assert storage.local_folder("gs://bucket/runs") is None


def _write_checkpoint(folder, step: int, version: int, registered: bool) -> None:
    (folder / f"step_{step:06d}").mkdir(parents=True)
    torch.save({"progress": {"step": step, "policy_version": version}}, folder / f"step_{step:06d}" / "state.pt")
    if registered:
        results = [{"checkpoint_dir_name": f"step_{step:06d}"}]
        (folder / "checkpoint_manager_snapshot.json").write_text(json.dumps({"checkpoint_results": results}))


def test_a_run_resumes_from_a_file_uri(tmp_path):
    _write_checkpoint(tmp_path / "nfs" / "exp", step=2, version=2, registered=True)
    _write_checkpoint(tmp_path / "nfs" / "exp", step=3, version=4, registered=False)  # written, never registered
    cfg = _cfg(f"trainer.storage_path=file://{tmp_path}/nfs", "trainer.experiment_name=exp")
    assert resume_point(cfg) == {"step": 3, "policy_version": 4}
    assert resume_point(_cfg(f"trainer.storage_path=file://{tmp_path}/elsewhere", "trainer.experiment_name=exp")) is None


def test_remote_storage_is_read_through_pyarrow(tmp_path, monkeypatch):
    """A URI that is not a folder here (s3://, gs://) goes through pyarrow.fs; its local filesystem stands in."""
    _write_checkpoint(tmp_path / "bucket" / "exp", step=5, version=5, registered=True)
    monkeypatch.setattr(storage, "local_folder", lambda root: None)  # nothing is a folder here: only pyarrow reads it
    root = f"file://{tmp_path}/bucket/exp"
    assert storage.read_bytes(root, "missing.json") is None
    snapshot = json.loads(storage.read_bytes(root, "checkpoint_manager_snapshot.json"))
    assert snapshot["checkpoint_results"][0]["checkpoint_dir_name"] == "step_000005"
    cfg = _cfg(f"trainer.storage_path=file://{tmp_path}/bucket", "trainer.experiment_name=exp")
    assert resume_point(cfg) == {"step": 5, "policy_version": 5}
