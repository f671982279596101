"""GRPO adapters: the loss equals verl's functions called directly; micro-batch/rank splits don't change it."""

from __future__ import annotations

import math

import pytest
import torch
from verl.trainer.ppo import core_algos

from configs import load_config
from trainers.grpo import (
    GlobalBatchInfo,
    LossInputs,
    grpo_loss,
    sequence_advantages,
    truncated_is_weights,
    verl_actor_config,
)

pytestmark = pytest.mark.unit

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 0, 0]], dtype=torch.float32)  # [3, 4]
LOG_PROB = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.5, -3.0, -0.2, -0.9], [-2.5, -0.1, 0.0, 0.0]])
OLD = torch.tensor([[-1.1, -1.5, -0.5, 0.0], [-1.0, -3.0, -0.4, -1.2], [-2.0, -0.3, 0.0, 0.0]])
REF = torch.tensor([[-1.2, -2.2, -0.6, 0.0], [-1.4, -2.9, -0.3, -1.0], [-2.4, -0.2, 0.0, 0.0]])
ENT = torch.tensor([[2.0, 1.5, 1.0, 0.0], [0.5, 0.7, 0.9, 1.1], [3.0, 2.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -0.5, 2.0]).unsqueeze(1) * MASK  # [3, 4]


def _actor(*overrides: str):
    cfg = load_config(None, ["actor_rollout_ref.actor.clip_ratio_high=0.28", *overrides])
    return cfg.actor_rollout_ref.actor


def _inputs(rows: slice = slice(None)) -> LossInputs:
    return LossInputs(log_prob=LOG_PROB[rows], old_log_prob=OLD[rows], advantages=ADV[rows],
                      response_mask=MASK[rows], entropy=ENT[rows], ref_log_prob=REF[rows])


def test_loss_equals_verl_functions_called_directly():
    actor = _actor("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
                   "actor_rollout_ref.actor.entropy_coeff=0.01")
    cfg = verl_actor_config(actor, max_response_length=4)
    loss, metrics = grpo_loss(cfg, _inputs(), GlobalBatchInfo(dp_size=1, batch_num_tokens=8, global_batch_size=3))

    direct_cfg = verl_actor_config(actor, max_response_length=4)
    direct_cfg.global_batch_info.update(dp_size=1, batch_num_tokens=8, global_batch_size=3, loss_scale_factor=4)
    mask = MASK.bool()
    pg, pg_metrics = core_algos.compute_policy_loss_vanilla(
        old_log_prob=OLD, log_prob=LOG_PROB, advantages=ADV, response_mask=mask, loss_agg_mode="token-mean",
        config=direct_cfg)
    ent = core_algos.agg_loss(ENT, mask, "token-mean", batch_num_tokens=8)
    kl = core_algos.agg_loss(core_algos.kl_penalty(LOG_PROB, REF, "low_var_kl"), mask, "token-mean", batch_num_tokens=8)
    assert torch.allclose(loss, pg - 0.01 * ent + 0.1 * kl)
    assert metrics["pg_loss"].item() == pytest.approx(pg.item())
    assert metrics["pg_clipfrac"].item() == pytest.approx(pg_metrics["actor/pg_clipfrac"])
    assert metrics["entropy"].item() == pytest.approx(ent.item())
    assert metrics["kl_loss"].item() == pytest.approx(kl.item())


def test_pg_loss_is_minus_mean_advantage_when_ratio_is_one():
    cfg = verl_actor_config(_actor(), max_response_length=4)
    inputs = LossInputs(log_prob=OLD, old_log_prob=OLD, advantages=ADV, response_mask=MASK)
    loss, metrics = grpo_loss(cfg, inputs, GlobalBatchInfo(dp_size=1, batch_num_tokens=8, global_batch_size=3))
    # tokens: 3 × (+1.0), 3 × (-0.5), 2 × (+2.0)  → -(3 - 1.5 + 4) / 8
    assert loss.item() == pytest.approx(-5.5 / 8)
    assert metrics["ppo_kl"].item() == pytest.approx(0.0)
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum"])
def test_micro_batch_and_rank_split_sums_to_the_whole_batch_loss(mode):
    actor = _actor(f"actor_rollout_ref.actor.loss_agg_mode={mode}", "actor_rollout_ref.actor.entropy_coeff=0.01")
    whole_info = GlobalBatchInfo(dp_size=1, batch_num_tokens=8, global_batch_size=3)
    whole, _ = grpo_loss(verl_actor_config(actor, 4), _inputs(), whole_info)
    # Two ranks (dp_size=2), rank 0 with two micro-batches: FSDP averages rank gradients, hence / 2.
    split_info = GlobalBatchInfo(dp_size=2, batch_num_tokens=8, global_batch_size=3)
    parts = [grpo_loss(verl_actor_config(actor, 4), _inputs(rows), split_info)[0]
             for rows in (slice(0, 1), slice(1, 2), slice(2, 3))]
    assert (sum(parts) / 2).item() == pytest.approx(whole.item(), rel=1e-6)


def test_grpo_advantages_hand_computed():
    adv = sequence_advantages([1.0, 0.0, 0.5, 0.5, 2.0], ["a", "a", "b", "b", "c"], norm_adv_by_std_in_grpo=True)
    std = math.sqrt(0.5)  # unbiased std of {1, 0}
    assert adv[0] == pytest.approx(0.5 / (std + 1e-6))
    assert adv[1] == pytest.approx(-0.5 / (std + 1e-6))
    assert adv[2:4] == [0.0, 0.0]  # equal rewards: no signal
    assert adv[4] == pytest.approx(2.0 / (1.0 + 1e-6))  # a group of one: verl uses mean 0, std 1
    dr = sequence_advantages([1.0, 0.0], ["a", "a"], norm_adv_by_std_in_grpo=False)
    assert dr == [0.5, -0.5]


def test_truncated_is_weights_are_capped_and_masked():
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.0, -3.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = truncated_is_weights(old, rollout, mask, cap=2.0)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, 0.0])  # exp(2) capped at 2; masked token 0


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo",
                                  "dppo_tv", "dppo_kl"])
def test_every_selectable_verl_loss_mode_runs_with_our_config(mode):
    cfg = verl_actor_config(_actor(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"), 4)
    log_prob = LOG_PROB.clone().requires_grad_(True)
    inputs = LossInputs(log_prob=log_prob, old_log_prob=OLD, advantages=ADV, response_mask=MASK)
    loss, metrics = grpo_loss(cfg, inputs, GlobalBatchInfo(dp_size=1, batch_num_tokens=8, global_batch_size=3))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all()
    assert log_prob.grad[~MASK.bool()].abs().sum() == 0  # masked tokens get no gradient
