"""The Ray Train per-worker loop (trainers layer): pull a batch, run a GRPO step, publish the adapter,
report metrics, checkpoint, resume.

Rank 0 is the only rank that talks to the source and the publisher and writes files; the batch reaches
the other ranks through ``broadcast_object_list``. Metrics also go to ``<run_dir>/learner_metrics.jsonl``
(rank 0, one line per step) because Ray Train V2 may hand back ``result.metrics = None``.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist

from agents.records import AdapterRef, Trajectory
from trainers.model import (
    build_policy,
    cpu_autocast,
    gather_adapter,
    load_training_state,
    resolve_device,
    save_adapter,
    training_state,
)
from trainers.optim import build_optimizer, make_scheduler
from trainers.publisher import latest_published, publish, shareable
from trainers.step import StepSettings, train_step
from trainers.spec import WorkerSpec, append_metrics
from trainers.storage import checkpoint_root, newest_checkpoint_on_disk

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """How far the learner got: the last trained step and the policy version it published (saved in checkpoints)."""

    step: int = 0
    policy_version: int = 0


def _pull_batch(source: Any, step: int, version: int, rank: int) -> list[Trajectory] | None:
    box: list[Any] = [ray.get(source.next_batch.remote(step, version)) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    if box[0] is not None and not box[0]:
        raise ValueError(f"the trajectory source returned an empty batch for step {step} (None ends training)")
    return box[0]


def _has_method(handle: Any, name: str) -> bool:
    try:
        return hasattr(getattr(handle, name), "remote")
    except AttributeError:
        return False


def _checkpoint_to_load(spec: WorkerSpec) -> ray.train.Checkpoint | None:
    mode = spec.trainer.resume_mode
    if mode == "disable":
        return None
    if mode == "resume_path":
        if not spec.trainer.resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        return ray.train.Checkpoint.from_directory(spec.trainer.resume_from_path)
    registered = ray.train.get_checkpoint()
    on_disk = newest_checkpoint_on_disk(checkpoint_root(spec.trainer), spec.trainer.experiment_name)
    if on_disk is not None and (registered is None or Path(registered.path).name < on_disk.name):
        return ray.train.Checkpoint.from_directory(str(on_disk))
    return registered


def _restore(spec: WorkerSpec, model, optimizer, scheduler, rank: int) -> Progress:
    checkpoint = _checkpoint_to_load(spec)
    if checkpoint is None:
        return Progress()
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / "state.pt", map_location="cpu", weights_only=False)
    load_training_state(model, optimizer, state)
    scheduler.load_state_dict(state["scheduler"])
    if rank == 0 and state.get("source") is not None and _has_method(spec.source, "load_state"):
        ray.get(spec.source.load_state.remote(state["source"]))
    progress = Progress(**state["progress"])
    log.info("resumed at step %d (policy version %d)", progress.step, progress.policy_version)
    return progress


def _save_checkpoint(spec, model, optimizer, scheduler, progress: Progress, folder: Path, rank: int) -> bool:
    """Write the checkpoint on rank 0 (a collective: every rank calls it). True on rank 0."""
    state = training_state(model, optimizer)
    if rank != 0:
        return False
    state["scheduler"] = scheduler.state_dict()
    state["progress"] = {"step": progress.step, "policy_version": progress.policy_version}
    state["source"] = ray.get(spec.source.state.remote()) if _has_method(spec.source, "state") else None
    torch.save(state, folder / "state.pt")
    return True


def _publish_adapter(spec: WorkerSpec, model, progress: Progress, rank: int) -> AdapterRef | None:
    adapter = gather_adapter(model)
    if rank != 0:
        return None
    version = progress.policy_version
    path = save_adapter(model, adapter, Path(spec.run_dir) / "adapters" / f"v{version}")
    ref = shareable(AdapterRef(version=version, path=str(path), base_model=spec.model.path, step=progress.step))
    publish(spec.publisher, ref)
    return ref


def _republish_restored(spec: WorkerSpec, model, restored: Progress, rank: int) -> Progress:
    """After a restore, put the restored weights on the replicas, keeping versions monotone (a collective).

    Two cases. A new launch resuming an interrupted run: the replicas sample the base model (version 0), so the
    restored adapter is published under its own version. A learner Ray Train restarted inside a run
    (``trainer.max_failures``): the replicas already sample versions the dead learner published after its last
    checkpoint; the restored weights are published as the next version, never reusing a number for other weights,
    so every token's version names the weights that sampled it. Groups sampled by the lost versions are trained
    like any stale group: against their recorded behaviour log-probs (``tis_imp_ratio_cap`` reweights them).
    """
    box: list[Any] = [latest_published(spec.publisher) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    latest = int(box[0])
    start = f"the step-{restored.step} checkpoint" if restored.step else "its initial weights (no checkpoint yet)"
    if latest == restored.policy_version:
        if latest > 0 and rank == 0:  # inside a run (a new launch finds the replicas at version 0)
            log.warning("learner restarted from %s (policy version %d), which the replicas already sample", start,
                        latest)
        return restored  # the replicas sample exactly these weights already
    version = restored.policy_version if latest < restored.policy_version else latest + 1
    if version != restored.policy_version and rank == 0:
        log.warning("learner restarted from %s (policy version %d) while the replicas sample version %d: publishing "
                    "the restored weights as version %d", start, restored.policy_version, latest, version)
    progress = Progress(step=restored.step, policy_version=version)
    _publish_adapter(spec, model, progress, rank)
    return progress


def _report(spec, model, optimizer, scheduler, progress: Progress, metrics: dict, checkpoint: bool, rank: int):
    if not checkpoint:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        on_rank0 = _save_checkpoint(spec, model, optimizer, scheduler, progress, Path(tmp), rank)
        ray.train.report(
            metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if on_rank0 else None,
            checkpoint_dir_name=f"step_{progress.step:06d}",
        )


def _settings(spec: WorkerSpec, device: torch.device) -> StepSettings:
    return StepSettings(
        actor=spec.actor, max_response_length=spec.max_response_length,
        norm_adv_by_std_in_grpo=spec.algorithm.norm_adv_by_std_in_grpo, temperature=spec.temperature,
        packed=spec.model.use_remove_padding, device=device, seed=spec.trainer.seed,
        autocast=cpu_autocast(spec.actor.fsdp_config, device),
    )


def quiet_report_lines() -> None:
    """Ray Train 2.60 logs every ``ray.train.report`` at INFO ("Reporting training result N: TrainingReport(...)",
    the step's whole metrics dict) through a logger named by its file path, which its own log-level setting
    (``RunConfig(logging_config=...)``) does not reach; per-step metrics are in learner_metrics.jsonl already."""
    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray version: nothing to quiet
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train entry point; ``config["spec"]`` is a ``WorkerSpec``."""
    quiet_report_lines()
    spec: WorkerSpec = config["spec"]
    ctx = ray.train.get_context()
    rank = ctx.get_world_rank()
    device = resolve_device(spec.trainer.device)
    if device.type == "cuda":
        import ray.train.torch as ray_torch

        device = ray_torch.get_device()
    model = build_policy(spec.model, spec.actor.fsdp_config, device, spec.trainer.seed)
    optimizer = build_optimizer(model, spec.actor.optim)
    scheduler = make_scheduler(optimizer, spec.actor.optim, spec.total_steps)
    progress = _restore(spec, model, optimizer, scheduler, rank)
    # Always asked, a fresh start included: a learner restarted before its first checkpoint reached Ray Train starts
    # from the initial weights while the replicas sample what the dead one published.
    progress = _republish_restored(spec, model, progress, rank)
    settings = _settings(spec, device)
    save_freq = spec.trainer.save_freq
    skipped, skipped_in_a_row = 0, 0
    while spec.total_steps is None or progress.step < spec.total_steps:
        step = progress.step + 1
        wait_start = time.perf_counter()
        batch = _pull_batch(spec.source, step, progress.policy_version, rank)
        if batch is None:
            break
        wait_s = time.perf_counter() - wait_start
        metrics = train_step(model, optimizer, scheduler, batch, step, settings)
        if math.isfinite(metrics["grad_norm"]):
            skipped_in_a_row = 0
        else:  # train_step left the weights as they were
            skipped, skipped_in_a_row = skipped + 1, skipped_in_a_row + 1
            if rank == 0:
                log.warning("step %d: gradient norm %s, optimizer step skipped (%d in a row; the run stops at %d)", step,
                            metrics["grad_norm"], skipped_in_a_row, spec.trainer.max_nonfinite_steps)
            if skipped_in_a_row >= spec.trainer.max_nonfinite_steps:
                raise FloatingPointError(
                    f"steps {step - skipped_in_a_row + 1}..{step}: non-finite gradient norm in {skipped_in_a_row} "
                    f"steps in a row (trainer.max_nonfinite_steps={spec.trainer.max_nonfinite_steps}); the run diverged")
        metrics["train/skipped_steps"] = float(skipped)
        progress = Progress(step=step, policy_version=progress.policy_version + 1)
        _publish_adapter(spec, model, progress, rank)
        metrics.update(step=float(step), policy_version=float(progress.policy_version), batch_wait_s=wait_s)
        if rank == 0:
            append_metrics(spec.run_dir, metrics)
            if spec.metrics_sink is not None:
                ray.get(spec.metrics_sink.learner.remote(metrics))
        last = spec.total_steps is not None and step == spec.total_steps
        checkpoint = (save_freq > 0 and step % save_freq == 0) or (last and save_freq != 0)
        _report(spec, model, optimizer, scheduler, progress, metrics, checkpoint, rank)
    else:
        return
    # The source ran dry before total_steps: checkpoint the final state unless the last step just did.
    if progress.step and not (save_freq > 0 and progress.step % save_freq == 0):
        _report(spec, model, optimizer, scheduler, progress, {"step": float(progress.step)}, True, rank)
