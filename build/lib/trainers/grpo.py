"""GRPO math: thin adapters over verl ``core_algos`` (trainers layer, pure torch, no distributed state).

Everything numeric here is verl's own function; this module only builds the arguments verl expects
(its ``ActorConfig`` dataclass, the global-batch normalisation info) and returns a metrics dict.

Loss normalisation follows verl's FSDP engine: every micro-batch loss is divided by the token (or
sequence) count of the whole mini-batch across all data-parallel ranks and multiplied by ``dp_size``,
so summing micro-batch gradients and letting FSDP average over ranks gives the exact mini-batch mean,
however the mini-batch was cut into micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as verl_F
from verl.workers.config.actor import ActorConfig as VerlActorConfig
from verl.workers.config.actor import PolicyLossConfig as VerlPolicyLossConfig

from configs.actor import ActorConfig

__all__ = [
    "GlobalBatchInfo",
    "LossInputs",
    "agg_loss",
    "compute_grpo_outcome_advantage",
    "entropy_from_logits",
    "get_policy_loss_fn",
    "grpo_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "sequence_advantages",
    "truncated_is_weights",
    "verl_actor_config",
]

agg_loss = core_algos.agg_loss
kl_penalty = core_algos.kl_penalty
get_policy_loss_fn = core_algos.get_policy_loss_fn
entropy_from_logits = verl_F.entropy_from_logits  # [..., V] -> [...]
logprobs_from_logits = verl_F.logprobs_from_logits  # ([..., V], [...]) -> [...]


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,  # [B, R] (the outcome reward on one token, 0 elsewhere)
    response_mask: torch.Tensor,  # [B, R]
    index: np.ndarray | list[str],  # [B] group ids (verl's uid)
    norm_adv_by_std_in_grpo: bool = True,
) -> torch.Tensor:
    """Group-relative advantages broadcast over response tokens: ``[B, R]`` (verl's function)."""
    advantages, _returns = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=np.asarray(index, dtype=object),
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    return advantages


def sequence_advantages(rewards: list[float], group_ids: list[str], norm_adv_by_std_in_grpo: bool) -> list[float]:
    """One GRPO advantage per trajectory (the value verl broadcasts over its response tokens)."""
    scores = torch.tensor(rewards, dtype=torch.float32).unsqueeze(-1)  # [B, 1]
    adv = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), group_ids, norm_adv_by_std_in_grpo)
    return adv[:, 0].tolist()


def verl_actor_config(actor: ActorConfig, max_response_length: int) -> VerlActorConfig:
    """verl's own ``ActorConfig`` dataclass with the fields its policy-loss functions read.

    ``loss_scale_factor`` is pinned to ``max_response_length``: verl pads responses to that length, so
    its ``seq-mean-token-sum-norm`` horizon is that constant; we pad less, so we pass it explicitly.
    """
    return VerlActorConfig(
        strategy="fsdp2",
        rollout_n=1,  # only read by verl's own data plumbing, not by the loss functions
        ppo_micro_batch_size_per_gpu=actor.micro_batch_size,
        use_dynamic_bsz=actor.use_dynamic_bsz,
        clip_ratio=actor.clip_ratio,
        clip_ratio_low=actor.clip_low,
        clip_ratio_high=actor.clip_high,
        clip_ratio_c=actor.clip_ratio_c,
        loss_agg_mode=actor.loss_agg_mode,
        loss_scale_factor=max_response_length,
        entropy_coeff=actor.entropy_coeff,
        use_kl_loss=actor.use_kl_loss,
        kl_loss_coef=actor.kl_loss_coef,
        kl_loss_type=actor.kl_loss_type,
        policy_loss=VerlPolicyLossConfig(loss_mode=actor.policy_loss.loss_mode),
    )


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Counts over one mini-batch on all ranks together (verl's ``global_batch_info``)."""

    dp_size: int
    batch_num_tokens: int  # response tokens with mask 1
    global_batch_size: int  # trajectories with at least one mask-1 token


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, response-aligned. All tensors ``[B, R]``; optional ones may be None."""

    log_prob: torch.Tensor  # current policy, with grad
    old_log_prob: torch.Tensor  # recomputed at the start of the step
    advantages: torch.Tensor
    response_mask: torch.Tensor  # 1 = sampled by the policy
    entropy: torch.Tensor | None = None  # with grad when entropy_coeff > 0
    ref_log_prob: torch.Tensor | None = None  # adapter disabled
    rollout_is_weights: torch.Tensor | None = None  # truncated IS weights, no grad


def truncated_is_weights(
    old_log_prob: torch.Tensor,  # [B, R]
    rollout_log_prob: torch.Tensor,  # [B, R]
    response_mask: torch.Tensor,  # [B, R]
    cap: float,
) -> torch.Tensor:
    """Truncated importance weights ``min(π_old / π_rollout, cap)`` (TIS), zero off-mask: ``[B, R]``."""
    log_ratio = torch.clamp(old_log_prob - rollout_log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(log_ratio), max=cap).detach() * response_mask


def grpo_loss(
    config: VerlActorConfig, inputs: LossInputs, info: GlobalBatchInfo
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss (+ entropy bonus, + KL loss) of one micro-batch, as verl's ``ppo_loss`` composes it.

    Returns the scalar to backpropagate and detached metrics. ``pg_loss``/``entropy``/``kl_loss`` are
    partial sums of the global mini-batch mean (sum them over micro-batches and ranks, divide by
    ``dp_size``); ``pg_clipfrac``/``ppo_kl`` are local token means (weight them by local tokens).
    """
    config.global_batch_info.update(
        dp_size=info.dp_size,
        batch_num_tokens=info.batch_num_tokens,
        global_batch_size=info.global_batch_size,
        loss_scale_factor=config.loss_scale_factor,
    )
    mask = inputs.response_mask.to(torch.bool)
    mode = config.loss_agg_mode
    pg_loss, pg_metrics = get_policy_loss_fn(config.policy_loss.loss_mode)(
        old_log_prob=inputs.old_log_prob,
        log_prob=inputs.log_prob,
        advantages=inputs.advantages,
        response_mask=mask,
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=inputs.rollout_is_weights,
    )
    loss = pg_loss
    metrics = {"pg_loss": pg_loss.detach()}
    for key, value in pg_metrics.items():
        metrics[key.removeprefix("actor/")] = torch.as_tensor(value, dtype=torch.float32)
    if inputs.entropy is not None:
        entropy = agg_loss(loss_mat=inputs.entropy, loss_mask=mask, loss_agg_mode=mode, **config.global_batch_info)
        if config.entropy_coeff:
            loss = loss - config.entropy_coeff * entropy
        metrics["entropy"] = entropy.detach()
    if config.use_kl_loss:
        if inputs.ref_log_prob is None:
            raise ValueError("actor.use_kl_loss=true but the micro-batch has no reference log-probs")
        kld = kl_penalty(logprob=inputs.log_prob, ref_logprob=inputs.ref_log_prob, kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=mode, **config.global_batch_info)
        loss = loss + config.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    return loss, metrics
