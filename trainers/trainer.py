"""Build and run the GRPO learner as a Ray Train ``TorchTrainer`` (trainers layer).

``build_trainer`` maps config sections onto Ray Train: workers = ``n_gpus_per_node × nnodes`` (gloo
on CPU, nccl on GPU), run name = ``trainer.experiment_name``, checkpoints under ``trainer.storage_path``
(default ``<run_dir>/ray_train``, see ``trainers/storage.py``) so that a second trainer with the same name
resumes (``trainer.resume_mode=auto``), failures retried ``trainer.max_failures`` times,
``trainer.max_actor_ckpt_to_keep`` checkpoints kept.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from configs import TandemConfig
from trainers.spec import LEARNER_METRICS, WorkerSpec
from trainers.storage import checkpoint_root, newest_checkpoint_on_disk, read_bytes


def train_loop(config: dict[str, Any]) -> None:
    """The Ray Train worker's entry point: the loop's module (peft, the FSDP and model code) is imported here, in the
    train worker; the driver only builds the trainer. (Not a start-up speed-up for ``apps.train``: its tokenizer
    import pulls in most of the same transformers stack.)"""
    from trainers.worker import train_loop_per_worker

    train_loop_per_worker(config)


def use_gpu(device: str) -> bool:
    """Whether ``trainer.device`` means GPUs here: ``cuda``, or ``auto`` when torch sees one."""
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def worker_spec(cfg: TandemConfig, source: Any, publisher: Any, total_steps: int | None = None,
                metrics_sink: Any = None) -> WorkerSpec:
    """The worker's slice of the experiment config (each component gets only its own sections)."""
    arr = cfg.actor_rollout_ref
    # workers run in other working directories: their run dir and checkpoint storage are absolute
    trainer = cfg.trainer.model_copy(update={"default_local_dir": str(Path(cfg.trainer.run_dir).resolve()),
                                             "storage_path": checkpoint_root(cfg.trainer)})
    return WorkerSpec(
        actor=arr.actor, model=arr.model, algorithm=cfg.algorithm, trainer=trainer,
        max_response_length=cfg.data.max_response_length, temperature=arr.rollout.temperature,
        run_dir=str(Path(cfg.trainer.run_dir).resolve()), source=source, publisher=publisher,
        metrics_sink=metrics_sink, total_steps=total_steps if total_steps is not None else cfg.trainer.total_training_steps,
    )


def build_trainer(
    cfg: TandemConfig, source: Any, publisher: Any = None, *, total_steps: int | None = None,
    num_cpus_per_worker: float = 1.0, metrics_sink: Any = None,
) -> TorchTrainer:
    """A ``TorchTrainer`` running ``train_loop_per_worker`` over ``source``, publishing to ``publisher`` and
    reporting each step's metrics to ``metrics_sink`` (an actor handle with ``learner(metrics)``) when given."""
    trainer_cfg = cfg.trainer
    gpu = use_gpu(trainer_cfg.device)
    spec = worker_spec(cfg, source, publisher, total_steps, metrics_sink)
    placement = trainer_cfg.placement
    resources = {**({} if gpu else {"CPU": num_cpus_per_worker}), **placement.resources} or None
    return TorchTrainer(
        train_loop,
        train_loop_config={"spec": spec},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=trainer_cfg.n_gpus_per_node * trainer_cfg.nnodes, use_gpu=gpu,
            resources_per_worker=resources, label_selector=dict(placement.label_selector) or None,
        ),
        run_config=RunConfig(
            name=trainer_cfg.experiment_name,
            storage_path=checkpoint_root(trainer_cfg),
            failure_config=FailureConfig(max_failures=trainer_cfg.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=trainer_cfg.max_actor_ckpt_to_keep),
            # Ray Train's per-report and worker-group INFO lines stay in its log files, off the console
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )


def resume_point(cfg: TandemConfig) -> dict[str, int] | None:
    """``{"step", "policy_version"}`` of the checkpoint the learner will restore (``trainer.resume_mode``), or None.

    ``auto``: the newest checkpoint Ray Train recorded for this run name under its storage path;
    ``resume_path``: that folder. The driver reads it before anything starts, so the data cursor and the admission
    bound continue from it.
    """
    trainer = cfg.trainer
    if trainer.resume_mode == "disable":
        return None
    if trainer.resume_mode == "resume_path":
        root, folder = trainer.resume_from_path or "", ""
    else:  # the same choice the worker makes: Ray Train's newest registered checkpoint, or a newer one on disk
        root = f"{checkpoint_root(trainer).rstrip('/')}/{trainer.experiment_name}"
        snapshot = read_bytes(root, "checkpoint_manager_snapshot.json")
        results = (json.loads(snapshot).get("checkpoint_results") or []) if snapshot else []
        folder = results[-1]["checkpoint_dir_name"] if results else ""  # report order: last = newest
        on_disk = newest_checkpoint_on_disk(checkpoint_root(trainer), trainer.experiment_name)
        if on_disk is not None and (not folder or folder < on_disk.name):
            folder = on_disk.name
        if not folder:
            return None
    state = read_bytes(root, f"{folder}/state.pt" if folder else "state.pt")
    if state is None:
        raise FileNotFoundError(f"trainer.resume_mode={trainer.resume_mode}: no state.pt in {root}/{folder}")
    progress = torch.load(io.BytesIO(state), map_location="cpu", weights_only=False)["progress"]
    return {"step": int(progress["step"]), "policy_version": int(progress["policy_version"])}


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    """Per-step metrics written by rank 0, one per step (a step retried after a failure keeps its last line)."""
    path = Path(run_dir).resolve() / LEARNER_METRICS
    if not path.exists():
        return []
    by_step: dict[int, dict[str, float]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_step[int(row["step"])] = row
    return [by_step[k] for k in sorted(by_step)]


def run_training(
    cfg: TandemConfig, source: Any, publisher: Any = None, *, total_steps: int | None = None,
    num_cpus_per_worker: float = 1.0,
) -> list[dict[str, float]]:
    """Fit the trainer and return the per-step metrics of the whole run (resumed steps included)."""
    result = build_trainer(cfg, source, publisher, total_steps=total_steps,
                           num_cpus_per_worker=num_cpus_per_worker).fit()
    if result.error is not None:
        raise result.error
    return read_metrics(cfg.trainer.run_dir)
