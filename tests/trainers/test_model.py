"""The policy on one in-process rank (gloo, world size 1): packed = padded = one-by-one log-probs, the
reference is the base model, and a trainer step's loss equals verl's functions called directly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM
from verl.trainer.ppo import core_algos
from verl.utils.torch_functional import entropy_from_logits

from configs import load_config
from trainers.batching import collate, samples_from_trajectories
from trainers.grpo import logprobs_from_logits, sequence_advantages
from trainers.model import build_policy, cpu_autocast, gather_adapter, response_logprobs
from trainers.step import StepSettings, train_step
from trainers.optim import build_optimizer, make_scheduler

from .conftest import make_trajectories

pytestmark = pytest.mark.integration
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _cfg(model_dir, *overrides):
    return load_config(None, [f"actor_rollout_ref.model.path={model_dir}", "data.max_response_length=32",
                              "actor_rollout_ref.model.lora_rank=4", *overrides])


def _one_by_one(model, sample, temperature=1.0):
    ids = torch.tensor([list(sample.prompt_ids) + list(sample.response_ids)])
    p = len(sample.prompt_ids)
    logits = model(input_ids=ids).logits[0, p - 1 : -1].float() / temperature  # [R, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, p:, None])[:, 0], entropy_from_logits(logits)


@torch.no_grad()
def test_packed_padded_and_one_by_one_log_probs_agree(one_rank, grpo_model_dir):
    cfg = _cfg(grpo_model_dir)
    model = build_policy(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.fsdp_config, CPU, seed=1)
    trajs = make_trajectories(2, 3, seed=5)
    samples = samples_from_trajectories(trajs, [0.0] * 6, 32)
    packed_mb = collate(samples, packed=True)
    assert packed_mb.input_ids.shape[0] < len(samples)  # some rows hold several sequences
    packed, ent = response_logprobs(model, packed_mb, CPU, 0.7, with_entropy=True)
    padded, _ = response_logprobs(model, collate(samples, packed=False), CPU, 0.7, with_entropy=False)
    for row, sample in enumerate(samples):
        lp, h = _one_by_one(model, sample, temperature=0.7)
        n = len(sample.response_ids)
        torch.testing.assert_close(packed[row, :n], lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded[row, :n], lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent[row, :n], h, atol=1e-5, rtol=1e-5)
        assert packed[row, n:].abs().sum() == 0


def test_bf16_mixed_precision_on_cpu_autocasts_the_forward_and_keeps_fp32_weights_and_grads(one_rank, grpo_model_dir):
    """fsdp_config.mixed_precision.param_dtype=bf16 on a CPU: the forward under bf16 autocast (log-probs within bf16's
    rounding of fp32's, not equal to them), the weights and the LoRA gradients fp32."""
    cfg = _cfg(grpo_model_dir, "actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: bf16}")
    fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    assert cpu_autocast(fsdp, CPU) and not cpu_autocast(_cfg(grpo_model_dir).actor_rollout_ref.actor.fsdp_config, CPU)
    model = build_policy(cfg.actor_rollout_ref.model, fsdp, CPU, seed=1)
    samples = samples_from_trajectories(make_trajectories(2, 2, seed=7), [0.0] * 4, 32)
    mb = collate(samples, packed=True)
    with torch.no_grad():
        full, _ = response_logprobs(model, mb, CPU, 1.0, with_entropy=False)
    half, _ = response_logprobs(model, mb, CPU, 1.0, with_entropy=False, autocast=True)
    assert half.dtype == torch.float32 and not torch.equal(half, full)
    torch.testing.assert_close(half, full, atol=0.1, rtol=0.05)
    half.sum().backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
                             for p in trainable)


@torch.no_grad()
@pytest.mark.parametrize("packed", [True, False])
def test_logits_only_where_needed_equal_the_full_logits_exactly(one_rank, grpo_model_dir, packed):
    cfg = _cfg(grpo_model_dir)
    model = build_policy(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.fsdp_config, CPU, seed=1)
    samples = samples_from_trajectories(make_trajectories(2, 4, seed=11), [0.0] * 8, 32)
    mb = collate(samples, packed=packed)
    assert not packed or mb.input_ids.shape[0] < len(samples)  # some rows hold several sequences
    # The computation before ``logits_to_keep``: logits at every position, then the response positions.
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask,
                   use_cache=False).logits  # a cache would turn off transformers' packed-sequence mask
    rows = logits.reshape(-1, logits.shape[-1])[mb.pred_index[mb.valid]].float() / 0.7  # [M, V]
    expected = torch.zeros(mb.valid.shape)
    expected[mb.valid] = logprobs_from_logits(rows, mb.labels[mb.valid])
    got, _ = response_logprobs(model, mb, CPU, 0.7, with_entropy=False)
    assert torch.equal(got, expected)


@torch.no_grad()
def test_reference_is_the_base_model_with_the_adapter_disabled(one_rank, grpo_model_dir):
    cfg = _cfg(grpo_model_dir)
    model = build_policy(cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor.fsdp_config, CPU, seed=1)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.fill_(0.05)  # make the adapter matter
    sample = samples_from_trajectories(make_trajectories(1, 1, seed=2), [0.0], 32)[0]
    mb = collate([sample], packed=True)
    with model.disable_adapter():
        ref, _ = response_logprobs(model, mb, CPU, 1.0, with_entropy=False)
    policy, _ = response_logprobs(model, mb, CPU, 1.0, with_entropy=False)
    base = AutoModelForCausalLM.from_pretrained(grpo_model_dir, dtype=torch.float32)
    expected, _ = _one_by_one(base, sample)
    n = len(sample.response_ids)
    torch.testing.assert_close(ref[0, :n], expected, atol=1e-5, rtol=1e-5)
    assert (policy[0, :n] - expected).abs().max() > 1e-3
    adapter = gather_adapter(model)
    assert all(".default." not in k for k in adapter) and any("lora_B" in k for k in adapter)


def test_trainer_step_loss_equals_verl_called_directly(one_rank, grpo_model_dir):
    cfg = _cfg(grpo_model_dir, "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
               "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64")
    actor = cfg.actor_rollout_ref.actor
    model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, CPU, seed=1)
    trajs = make_trajectories(3, 4, seed=7)
    adv = sequence_advantages([t.reward for t in trajs], [t.group_id for t in trajs], True)
    # Expected, computed before the update with verl's functions on one-by-one log-probs.
    with torch.no_grad():
        rows = [_one_by_one(model, s) for s in samples_from_trajectories(trajs, adv, 32)]
    width = max(len(t.response_ids) for t in trajs)
    pad = lambda xs: torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in xs])  # noqa: E731
    lp, ent = pad([r[0] for r in rows]), pad([r[1] for r in rows])
    mask = pad([torch.tensor(t.response_mask, dtype=torch.float32) for t in trajs])
    adv_tok = torch.tensor(adv).unsqueeze(1) * (pad([torch.ones(len(t.response_ids)) for t in trajs]))
    from trainers.grpo import verl_actor_config

    pg, pg_m = core_algos.compute_policy_loss_vanilla(lp, lp, adv_tok, mask.bool(), "token-mean",
                                                      config=verl_actor_config(actor, 32))
    rollout = pad([torch.tensor(t.rollout_logprobs) for t in trajs])

    settings = StepSettings(actor=actor, max_response_length=32, norm_adv_by_std_in_grpo=True, temperature=1.0,
                            packed=True, device=CPU, seed=1)
    optimizer = build_optimizer(model, actor.optim)
    metrics = train_step(model, optimizer, make_scheduler(optimizer, actor.optim, 1), trajs, 1, settings)
    assert metrics["num_updates"] == 1  # 3 groups = one mini-batch, cut into several 64-token micro-batches
    assert metrics["pg_loss"] == pytest.approx(pg.item(), rel=1e-5)
    assert metrics["ppo_kl"] == pytest.approx(pg_m["actor/ppo_kl"], abs=1e-6)
    assert metrics["entropy"] == pytest.approx(core_algos.agg_loss(ent, mask.bool(), "token-mean").item(), rel=1e-5)
    gap = ((rollout - lp).abs() * mask).sum() / mask.sum()
    assert metrics["rollout_logprob_gap"] == pytest.approx(gap.item(), rel=1e-5)
    assert metrics["grad_norm"] > 0


def test_kl_loss_and_truncated_is_paths(one_rank, grpo_model_dir):
    cfg = _cfg(grpo_model_dir, "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
               "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0",
               "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.model.use_remove_padding=false")
    actor = cfg.actor_rollout_ref.actor
    model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, CPU, seed=1)
    settings = StepSettings(actor=actor, max_response_length=32, norm_adv_by_std_in_grpo=True, temperature=1.0,
                            packed=False, device=CPU, seed=1)
    optimizer = build_optimizer(model, actor.optim)
    metrics = train_step(model, optimizer, make_scheduler(optimizer, actor.optim, 1), make_trajectories(2, 4, 9), 1,
                         settings)
    # Mini-batch 1 runs with the adapter still zero (policy = reference, KL 0); mini-batch 2 after an update.
    assert metrics["num_updates"] == 2
    assert metrics["kl_loss"] > 0
    assert metrics["ppo_kl"] != 0


@pytest.mark.slow
@pytest.mark.parametrize("kl", [False, True])
def test_on_policy_step_without_the_recompute_pass_equals_the_recomputed_step(one_rank, grpo_model_dir, monkeypatch,
                                                                               kl):
    import trainers.step as step_module

    cfg = _cfg(grpo_model_dir, "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
               "actor_rollout_ref.actor.tis_imp_ratio_cap=2.0", "actor_rollout_ref.actor.optim.lr=0.05",
               f"actor_rollout_ref.actor.use_kl_loss={kl}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    actor = cfg.actor_rollout_ref.actor
    settings = StepSettings(actor=actor, max_response_length=32, norm_adv_by_std_in_grpo=True, temperature=1.0,
                            packed=True, device=CPU, seed=1)
    results, passes = [], []
    real_recompute = step_module.recompute_log_probs

    def counting(model, samples, plans, s, old=True):
        passes.append(old)
        return real_recompute(model, samples, plans, s, old)

    monkeypatch.setattr(step_module, "recompute_log_probs", counting)
    for shortcut in (True, False):
        monkeypatch.setattr(step_module, "is_on_policy", lambda plans, a, m, _s=shortcut: _s)
        model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, CPU, seed=1)
        optimizer = build_optimizer(model, actor.optim)
        scheduler = make_scheduler(optimizer, actor.optim, 2)
        # Step 2 runs with a non-zero adapter: log-probs, TIS weights and the KL are not trivial there.
        metrics = [train_step(model, optimizer, scheduler, make_trajectories(3, 4, seed=k), k, settings) for k in (1, 2)]
        weights = {n: p.detach().full_tensor().clone() for n, p in model.named_parameters() if p.requires_grad}
        results.append((metrics, weights))
    assert passes == [False, False, True, True]  # the shortcut asked for no old log-probs
    (fast, fast_w), (slow, slow_w) = results
    for a, b in zip(fast, slow):
        for key in ("pg_loss", "entropy", "ppo_kl", "grad_norm", "rollout_logprob_gap", *(("kl_loss",) if kl else ())):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), key
    assert fast[1]["rollout_logprob_gap"] > 0
    for name, weight in fast_w.items():
        torch.testing.assert_close(weight, slow_w[name], atol=1e-5, rtol=1e-4, msg=name)


def test_on_policy_needs_one_update_and_no_dropout(grpo_model_dir):
    from trainers.step import has_dropout, is_on_policy

    cfg = _cfg(grpo_model_dir)
    actor = cfg.actor_rollout_ref.actor
    model = AutoModelForCausalLM.from_pretrained(grpo_model_dir, dtype=torch.float32)
    assert not has_dropout(model)
    assert is_on_policy([object()], actor, model)
    assert not is_on_policy([object(), object()], actor, model)
    assert not is_on_policy([object()], actor.model_copy(update={"ppo_epochs": 2}), model)
    model.config.attention_dropout = 0.1
    assert has_dropout(model) and not is_on_policy([object()], actor, model)
