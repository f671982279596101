"""The optimizer and LR schedule of a training worker (trainers layer, pure torch; no Ray, no process group).

Kept apart from ``trainers.worker`` (the Ray Train loop) so that code running a step without Ray — the
benchmarks, the GPU check, the tests — builds them exactly as a worker does.
"""

from __future__ import annotations

import torch
from verl.utils.torch_functional import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
)

from configs.actor import OptimConfig


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (the LoRA adapter when the model has one)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay)


def make_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int | None):
    """verl's LR schedules; one scheduler step per training step (as verl's actor)."""
    total = optim.total_training_steps if optim.total_training_steps > 0 else total_steps
    warmup = optim.lr_warmup_steps
    if warmup < 0:
        if optim.lr_warmup_steps_ratio and not total:
            raise ValueError("actor.optim.lr_warmup_steps_ratio needs a known number of training steps")
        warmup = int(optim.lr_warmup_steps_ratio * (total or 0))
    kind = optim.warmup_style or optim.lr_scheduler_type
    if kind == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    if not total:
        raise ValueError("actor.optim.lr_scheduler_type=cosine needs trainer.total_training_steps")
    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup, num_training_steps=total,
                                           min_lr_ratio=optim.min_lr_ratio)
