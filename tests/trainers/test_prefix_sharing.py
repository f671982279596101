"""Shared-prompt layout (``use_prefix_grouper``): the hand-computed layout and mask, and log-probs and LoRA
gradients equal to the unshared computation on the tiny model (fp32), also through a whole FSDP2 step."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from configs import load_config
from configs.actor import ModelConfig
from trainers.batching import Sample, collate, samples_from_trajectories
from trainers.model import build_policy, load_base_model, response_logprobs
from trainers.prefix import collate_shared
from trainers.step import StepSettings, train_step
from trainers.optim import build_optimizer, make_scheduler

from .conftest import make_trajectories

CPU = torch.device("cpu")
X = Sample(prompt_ids=(1, 2), response_ids=(3, 4), response_mask=(1, 1), rollout_logprobs=(0.0, 0.0), advantage=1.0,
           group_id="g")
Y = Sample(prompt_ids=(1, 2), response_ids=(5,), response_mask=(1,), rollout_logprobs=(0.0,), advantage=-1.0,
           group_id="g")
Z = Sample(prompt_ids=(7,), response_ids=(8, 9), response_mask=(0, 1), rollout_logprobs=(0.0, 0.0), advantage=0.5,
           group_id="h")


@pytest.mark.unit
def test_shared_layout_and_mask():
    mb = collate_shared([X, Z, Y])
    # Segment (1,2 | X: 3,4 | Y: 5) fills row 0; segment (7 | Z: 8,9) and a 2-token tail fill row 1.
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [7, 8, 9, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 2, 0, 1]]  # Y's response continues at 2
    # X's 3 and Y's 5 are both predicted by the prompt's last token (flat 1); Z's 8, 9 by flat 5, 6.
    assert mb.pred_index.tolist() == [[1, 2], [5, 6], [1, 0]]
    assert mb.labels.tolist() == [[3, 4], [8, 9], [5, 0]]
    assert mb.response_mask.tolist() == [[1, 1], [0, 1], [1, 0]]
    assert mb.attention_mask.shape == (2, 1, 5, 5) and mb.attention_mask.dtype == torch.bool
    assert mb.attention_mask[0, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],  # X's first token: the prompt and itself
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],  # Y's token: the prompt and itself, not X's response
    ]
    assert mb.attention_mask[1, 0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],  # the row tail is a block of its own (no query row is fully masked)
        [0, 0, 0, 1, 1],
    ]
    assert (mb.num_tokens, mb.padded_tokens) == (8, 10)


def _mixed_samples() -> list[Sample]:
    """Two groups of 4 (varied response lengths, tool spans with mask 0), interleaved, and one sample of
    group 0 whose prompt differs from its group's."""
    trajs = make_trajectories(2, 4, seed=3)
    samples = samples_from_trajectories(trajs, [0.3, -0.7, 1.1, -0.2, 0.9, -1.3, 0.4, 0.6], 32)
    samples = [samples[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)]
    samples[2] = replace(samples[2], prompt_ids=samples[2].prompt_ids + (11,))
    assert len({len(s.response_ids) for s in samples}) > 2 and any(0 in s.response_mask for s in samples)
    return samples


def _lora_model(model_dir, attn: str = "sdpa"):
    cfg = ModelConfig(path=str(model_dir), lora_rank=4, override_config={"attn_implementation": attn})
    torch.manual_seed(1)
    model = load_base_model(cfg, lora=True)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # non-zero B, so that lora_A gets gradients too
            param.data.normal_(0.0, 0.1)
    return model


def _log_probs_and_grads(model, mb) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    log_prob, entropy = response_logprobs(model, mb, CPU, 0.8, with_entropy=True)
    (log_prob * mb.advantages * mb.response_mask).sum().add(entropy.sum() * 0.1).backward()
    return log_prob.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.integration
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_log_probs_and_lora_grads_equal_unshared(grpo_model_dir, attn):
    # float64 weights: a LoRA gradient sums over every token and the two layouts add in a different order; in fp32
    # that alone moved a gradient by 2.9e-5 (entries up to 25) on one CPU model and not on another. (The log-softmax
    # stays fp32 in response_logprobs.)
    model = _lora_model(grpo_model_dir, attn).to(torch.float64)
    samples = _mixed_samples()
    shared_mb = collate_shared(samples)
    assert shared_mb.num_tokens < collate(samples, packed=True).num_tokens  # prompts are laid out once
    expected, expected_grads = _log_probs_and_grads(model, collate(samples, packed=True))
    got, grads = _log_probs_and_grads(model, shared_mb)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert expected_grads.keys() == grads.keys() and any("lora_A" in k for k in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg_prefix") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.parametrize("overrides", [
    ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],
    ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64"],
])
def test_fsdp_step_with_shared_prompts_equals_the_unshared_step(one_rank, grpo_model_dir, overrides):
    results = []
    for share in (False, True):
        cfg = load_config(None, [f"actor_rollout_ref.model.path={grpo_model_dir}", "data.max_response_length=32",
                                 "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                 "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.use_kl_loss=true",
                                 f"actor_rollout_ref.actor.use_prefix_grouper={share}", *overrides])
        actor = cfg.actor_rollout_ref.actor
        model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, CPU, seed=1)
        settings = StepSettings(actor=actor, max_response_length=32, norm_adv_by_std_in_grpo=True, temperature=1.0,
                                packed=True, device=CPU, seed=1)
        optimizer = build_optimizer(model, actor.optim)
        scheduler = make_scheduler(optimizer, actor.optim, 2)
        # Two steps of 2 mini-batches each: the second mini-batch and step run on updated weights.
        metrics = [train_step(model, optimizer, scheduler, make_trajectories(4, 4, seed=k), k, settings)
                   for k in (1, 2)]
        weights = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((metrics, weights))
    (plain, plain_w), (shared, shared_w) = results
    for before, after in zip(plain, shared):
        for key in ("pg_loss", "entropy", "kl_loss", "ppo_kl", "grad_norm", "rollout_logprob_gap"):
            assert after[key] == pytest.approx(before[key], rel=1e-4, abs=1e-7), key
    for name, weight in shared_w.items():
        torch.testing.assert_close(weight, plain_w[name], atol=1e-5, rtol=1e-4, msg=name)
