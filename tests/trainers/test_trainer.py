"""The learner on a local Ray cluster: 2 FSDP2 workers on CPU (gloo), adapter publishing, kill-free resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from configs import load_config
from trainers.publisher import adapter_log_actor
from trainers.source import list_source_actor
from trainers.trainer import read_metrics, run_training

from .conftest import make_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _cfg(model_dir: Path, run_dir: Path, name: str, *overrides: str):
    return load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.lora_rank=4",
        "data.max_response_length=32", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.optim.lr=0.01", "trainer.n_gpus_per_node=2", "trainer.device=cpu",
        f"trainer.default_local_dir={run_dir}", f"trainer.experiment_name={name}", "trainer.seed=3", *overrides,
    ])


def _probe_loop(config: dict) -> None:
    """The worker's building blocks on 2 ranks, keeping full weights before/after one step for the test."""
    import ray.train
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from trainers.model import build_policy, gather_adapter
    from trainers.step import StepSettings, train_step
    from trainers.optim import build_optimizer, make_scheduler

    spec, device = config["spec"], torch.device("cpu")
    model = build_policy(spec.model, spec.actor.fsdp_config, device, spec.trainer.seed)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    before = get_model_state_dict(model, options=full)
    optimizer = build_optimizer(model, spec.actor.optim)
    settings = StepSettings(actor=spec.actor, max_response_length=spec.max_response_length,
                            norm_adv_by_std_in_grpo=True, temperature=1.0, packed=True, device=device, seed=1)
    metrics = train_step(model, optimizer, make_scheduler(optimizer, spec.actor.optim, 1), config["batch"], 1, settings)
    after = get_model_state_dict(model, options=full)
    adapter = gather_adapter(model)
    if dist.get_rank() == 0:
        torch.save({"before": before, "after": after, "adapter": adapter, "metrics": metrics}, config["out"])
    ray.train.report({})


def test_two_worker_step_changes_lora_only(ray_cluster, grpo_model_dir, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from trainers.trainer import worker_spec

    cfg = _cfg(grpo_model_dir, tmp_path, "probe")
    out = tmp_path / "probe.pt"
    trainer = TorchTrainer(
        _probe_loop,
        train_loop_config={"spec": worker_spec(cfg, None, None), "batch": make_trajectories(2, 4, seed=11),
                           "out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name="probe", storage_path=str(tmp_path / "ray")),
    )
    assert trainer.fit().error is None
    state = torch.load(out, weights_only=False)
    before, after = state["before"], state["after"]
    lora = [k for k in before if "lora_" in k]
    base = [k for k in before if "lora_" not in k]
    assert lora and base
    assert all(torch.equal(before[k], after[k]) for k in base), "a base weight changed"
    assert all(not torch.equal(before[k], after[k]) for k in lora if "lora_B" in k)
    # The gathered (published) adapter is the trained LoRA weights, under peft's saved key names.
    assert sorted(state["adapter"]) == sorted(k.replace(".default", "") for k in lora)
    for key in lora:
        assert torch.equal(state["adapter"][key.replace(".default", "")], after[key])
    assert state["metrics"]["num_updates"] == 2


def _train(cfg, trajectories, total_steps):
    source, publisher = list_source_actor(trajectories, 2), adapter_log_actor()
    metrics = run_training(cfg, source, publisher, total_steps=total_steps)
    import ray

    return metrics, ray.get(publisher.published.remote())


def test_kill_free_resume_matches_an_uninterrupted_run(ray_cluster, grpo_model_dir, tmp_path):
    """A run resumed from another run's step-2 checkpoint (``trainer.resume_mode=resume_path``) trains step 3 exactly
    as the uninterrupted run did. (``auto``, which finds the newest checkpoint of the same run by itself, differs only
    in that lookup: tests/trainers/test_storage.py, and end to end the Ctrl-C relaunch in tests/apps/test_chaos.py.)"""
    trajectories = make_trajectories(8, 4, seed=21)
    full_cfg = _cfg(grpo_model_dir, tmp_path / "full", "full", "trainer.save_freq=1")
    full, full_refs = _train(full_cfg, trajectories, 3)
    assert [m["step"] for m in full] == [1, 2, 3]
    assert [r.version for r in full_refs] == [1, 2, 3]
    step2 = tmp_path / "full" / "ray_train" / "full" / "step_000002"
    v2 = load_file(Path(full_refs[1].path) / "adapter_model.safetensors")
    # A new trainer, a new source actor (cursor at 0), another run name and storage: resumes at step 3, after
    # publishing the restored adapter again (fresh replicas would otherwise sample the base model).
    split_cfg = _cfg(grpo_model_dir, tmp_path / "split", "split", "trainer.save_freq=1",
                     "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step2}")
    resumed, refs = _train(split_cfg, trajectories, 3)
    assert [r.version for r in refs] == [2, 3]
    republished = load_file(Path(refs[0].path) / "adapter_model.safetensors")
    assert v2.keys() == republished.keys() and all(torch.equal(v2[k], republished[k]) for k in v2)
    assert [m["step"] for m in resumed] == [3]  # this run's own steps
    assert read_metrics(tmp_path / "split")[-1]["policy_version"] == 3
    for key in ("pg_loss", "grad_norm", "entropy", "rollout_logprob_gap", "advantages/mean"):
        assert resumed[0][key] == pytest.approx(full[2][key], rel=1e-5, abs=1e-7), key
    adapter_full = load_file(Path(full_refs[-1].path) / "adapter_model.safetensors")
    adapter_split = load_file(Path(refs[-1].path) / "adapter_model.safetensors")
    assert adapter_full.keys() == adapter_split.keys()
    assert all(torch.allclose(adapter_full[k], adapter_split[k], atol=1e-6) for k in adapter_full)
    assert (Path(refs[-1].path) / "adapter_config.json").is_file()
    # The adapter the worker published is the trained one kept in the step-3 checkpoint.
    state = torch.load(tmp_path / "full" / "ray_train" / "full" / "step_000003" / "state.pt", weights_only=False)
    trained = {k.replace(".default", ""): v for k, v in state["model"].items()}
    assert trained.keys() == adapter_full.keys()
    assert all(torch.equal(trained[k], adapter_full[k]) for k in trained)
    assert state["progress"] == {"step": 3, "policy_version": 3} and state["source"] == {"cursor": 6}
