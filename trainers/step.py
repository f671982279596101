"""One GRPO training step on one rank (trainers layer; torch.distributed collectives, no Ray).

advantages (verl GRPO) → plan (mini-batches by group, balanced ranks, micro-batches) → recompute old
(and reference) log-probs with the current weights → ``ppo_epochs`` × mini-batches × micro-batches of
forward/backward with gradient accumulation → clip → AdamW step per mini-batch → one LR-schedule step.
Returns the step's metrics, reduced over ranks (identical on every rank).

On-policy steps (one mini-batch, one epoch, no dropout) skip the recompute pass: the weights that would
recompute ``old_log_prob`` are the ones the single update's forward runs with, so the old log-probs are that
forward's log-probs, detached; the ratio is 1 and its gradient the policy gradient, as with the recompute.
That pass was a third of the learner's time (measured: 4.5 s of 15 s per 8-sample group of SmolLM2-135M on
one CPU thread). verl 0.9 always recomputes (``_compute_old_log_prob``) unless ``bypass_mode``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import torch.distributed as dist

from agents.records import Trajectory
from configs.actor import ActorConfig
from trainers.batching import (
    MicroBatch,
    MiniBatchPlan,
    Sample,
    collate,
    filler,
    plan_step,
    samples_from_trajectories,
)
from trainers.grpo import LossInputs, grpo_loss, sequence_advantages, truncated_is_weights, verl_actor_config
from trainers.model import response_logprobs
from trainers.prefix import collate_shared

# Partial sums of a global mini-batch mean (verl normalisation): reduce by SUM, divide by dp_size.
_GLOBAL_SUMS = ("pg_loss", "entropy", "kl_loss")
# Local token means: weight by local mask tokens, reduce by SUM, divide by all tokens.
_TOKEN_MEANS = ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower")


@dataclass(frozen=True)
class StepSettings:
    """What a step needs besides the actor config; built once per worker."""

    actor: ActorConfig
    max_response_length: int
    norm_adv_by_std_in_grpo: bool
    temperature: float
    packed: bool
    device: torch.device
    seed: int
    autocast: bool = False  # bf16 autocast of the forward (trainers.model.cpu_autocast)


def _collate(samples: list[Sample], plan: MiniBatchPlan, indices: list[int], s: StepSettings) -> MicroBatch:
    """One micro-batch (a filler copy when this rank has none left) in the configured layout."""
    items = [samples[i] for i in indices] if indices else [filler(samples[plan.filler_index])]
    return collate_shared(items) if s.actor.use_prefix_grouper else collate(items, s.packed)


def has_dropout(model) -> bool:
    """Whether a training-mode forward differs from an eval-mode one (dropout modules or attention dropout)."""
    config = getattr(model, "config", None)
    if any(float(getattr(config, key, 0.0) or 0.0) > 0 for key in ("attention_dropout", "attn_pdrop")):
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def is_on_policy(plans: list[MiniBatchPlan], actor: ActorConfig, model) -> bool:
    """One optimizer update per step on eval-equivalent forwards: ``old_log_prob`` = the update's own."""
    return len(plans) == 1 and actor.ppo_epochs == 1 and not has_dropout(model)


@torch.no_grad()
def recompute_log_probs(
    model, samples: list[Sample], plans: list[MiniBatchPlan], s: StepSettings, old: bool = True
) -> list[Sample]:
    """Attach ``old_log_prob`` (unless ``old`` is false) and ``ref_log_prob`` (with the KL loss) to this
    rank's samples."""
    out = list(samples)
    if not old and not s.actor.use_kl_loss:
        return out
    for plan in plans:
        for indices in plan.micro_batches:
            mb = _collate(samples, plan, indices, s)
            if old:
                old_lp, _ = response_logprobs(model, mb, s.device, s.temperature, with_entropy=False, autocast=s.autocast)
            ref = None
            if s.actor.use_kl_loss:
                with model.disable_adapter():
                    ref, _ = response_logprobs(model, mb, s.device, s.temperature, with_entropy=False, autocast=s.autocast)
            for row, i in enumerate(indices):
                n = len(samples[i].response_ids)
                out[i] = replace(out[i], old_log_prob=old_lp[row, :n].cpu() if old else None,
                                 ref_log_prob=None if ref is None else ref[row, :n].cpu())
    return out


def _loss_inputs(model, mb, s: StepSettings) -> tuple[LossInputs, int]:
    """The loss inputs of one micro-batch; without recomputed old log-probs (an on-policy step) the forward's
    own, detached, are the old ones."""
    with_entropy = s.actor.calculate_entropy or s.actor.entropy_coeff > 0
    log_prob, entropy = response_logprobs(model, mb, s.device, s.temperature, with_entropy, autocast=s.autocast)
    if entropy is not None and not s.actor.entropy_coeff:
        entropy = entropy.detach()
    dev = s.device
    mask = mb.response_mask.to(dev)
    old = log_prob.detach() if mb.old_log_probs is None else mb.old_log_probs.to(dev)
    weights = None
    if s.actor.tis_imp_ratio_cap > 0:
        weights = truncated_is_weights(old, mb.rollout_log_probs.to(dev), mask, s.actor.tis_imp_ratio_cap)
    inputs = LossInputs(
        log_prob=log_prob, old_log_prob=old, advantages=mb.advantages.to(dev), response_mask=mask,
        entropy=entropy, ref_log_prob=None if mb.ref_log_probs is None else mb.ref_log_probs.to(dev),
        rollout_is_weights=weights,
    )
    return inputs, int(mb.response_mask.sum().item())


def _update(model, optimizer, samples, plan, s: StepSettings, verl_cfg, sums: dict[str, float]) -> float:
    """One mini-batch: accumulate micro-batch gradients, clip, step. Returns the gradient norm. On-policy
    (no recomputed old log-probs) the rollout log-prob gap is summed here, from the forward's log-probs."""
    for indices in plan.micro_batches:
        mb = _collate(samples, plan, indices, s)
        inputs, tokens = _loss_inputs(model, mb, s)
        if mb.old_log_probs is None:
            gap = (mb.rollout_log_probs.to(s.device) - inputs.old_log_prob).abs() * inputs.response_mask
            sums["_gap"] += float(gap.sum())
            sums["_gap_tokens"] += float(inputs.response_mask.sum())
        loss, metrics = grpo_loss(verl_cfg, inputs, plan.info)
        loss.backward()
        for key, value in metrics.items():
            weight = tokens if key in _TOKEN_MEANS else 1.0
            sums[key] = sums.get(key, 0.0) + float(value) * weight
        sums["_tokens"] = sums.get("_tokens", 0.0) + tokens
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=s.actor.grad_clip)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    if torch.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def _reduce(sums: dict[str, float], keys: Sequence[str]) -> dict[str, float]:
    values = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def batch_metrics(
    trajectories: Sequence[Trajectory], advantages: Sequence[float], max_response_length: int
) -> dict[str, float]:
    """Advantage stats over policy tokens (as verl) and response-length stats over trajectories."""
    adv = torch.tensor([a for t, a in zip(trajectories, advantages) for _ in range(t.num_policy_tokens)])
    lengths = [len(t.response_ids) for t in trajectories]
    out = {  # plain floats: the buffer reports the same two from the same batch, and they must agree
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": sum(n >= max_response_length for n in lengths) / len(lengths),
    }
    if adv.numel():
        out.update({"advantages/mean": adv.mean().item(), "advantages/std": adv.std(unbiased=False).item(),
                    "advantages/max": adv.max().item(), "advantages/min": adv.min().item()})
    return out


def train_step(
    model, optimizer, scheduler, trajectories: Sequence[Trajectory], step: int, s: StepSettings
) -> dict[str, float]:
    """Run one GRPO step on this rank's share of ``trajectories`` (every rank passes the whole batch)."""
    start = time.perf_counter()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    advantages = sequence_advantages([t.reward for t in trajectories], [t.group_id for t in trajectories],
                                     s.norm_adv_by_std_in_grpo)
    samples = samples_from_trajectories(trajectories, advantages, s.max_response_length)
    actor = s.actor
    plans = plan_step(
        samples, rank=rank, world_size=world, groups_per_mini_batch=actor.ppo_mini_batch_size,
        use_dynamic_bsz=actor.use_dynamic_bsz, micro_batch_size=actor.micro_batch_size,
        max_token_len=actor.ppo_max_token_len_per_gpu, packed=s.packed, share_prompts=actor.use_prefix_grouper,
        shuffle_seed=s.seed + step if actor.shuffle else None,
    )
    on_policy = is_on_policy(plans, actor, model)
    model.eval()  # no dropout in the recompute pass (LoRA dropout is 0; base dropout follows the HF config)
    samples = recompute_log_probs(model, samples, plans, s, old=not on_policy)
    # the rollout log-prob gap: from the recomputed old log-probs here, on-policy from the update's forward
    sums: dict[str, float] = {"_gap": 0.0, "_gap_tokens": 0.0}
    for plan in plans if not on_policy else ():
        for i in (i for mb in plan.micro_batches for i in mb):
            mask = torch.tensor(samples[i].response_mask, dtype=torch.float32)
            rollout = torch.tensor(samples[i].rollout_logprobs)
            sums["_gap"] += float(((rollout - samples[i].old_log_prob).abs() * mask).sum())
            sums["_gap_tokens"] += float(mask.sum())
    model.train()
    verl_cfg = verl_actor_config(actor, s.max_response_length)
    grad_norms = []
    lr = optimizer.param_groups[0]["lr"]
    for _epoch in range(actor.ppo_epochs):
        for plan in plans:
            grad_norms.append(_update(model, optimizer, samples, plan, s, verl_cfg, sums))
    scheduler.step()
    updates = len(grad_norms)
    keys = [*_GLOBAL_SUMS, *_TOKEN_MEANS, "_tokens", "_gap", "_gap_tokens"]
    total = _reduce(sums, keys)
    metrics = {k: total[k] / world / updates for k in _GLOBAL_SUMS if k in sums}
    metrics.update({k: total[k] / max(total["_tokens"], 1.0) for k in _TOKEN_MEANS if k in sums})
    metrics["rollout_logprob_gap"] = total["_gap"] / max(total["_gap_tokens"], 1.0)
    metrics["grad_norm"] = sum(grad_norms) / updates
    metrics["lr"] = lr
    metrics.update(batch_metrics(trajectories, advantages, s.max_response_length))
    elapsed = time.perf_counter() - start
    metrics["step_time_s"] = elapsed
    metrics["tokens_per_s"] = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories) / elapsed
    metrics["num_updates"] = float(updates)
    return metrics
