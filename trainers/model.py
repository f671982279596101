"""The policy model on a training worker: peft LoRA over a Hugging Face causal LM, sharded with FSDP2
``fully_shard`` (trainers layer; runs inside a torch.distributed process group).

One copy of the weights serves three roles: the trained policy (adapter on), the reference policy
(``with model.disable_adapter():``, no second copy) and the source of published adapters (gathered to
rank 0 with ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM

from configs.actor import FSDPConfig, ModelConfig
from trainers.batching import MicroBatch
from trainers.grpo import entropy_from_logits, logprobs_from_logits

log = logging.getLogger(__name__)

_FULL_TRAINABLE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)


def resolve_device(device: str) -> torch.device:
    """``trainer.device`` → a torch device (``auto``: CUDA when present)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def load_base_model(model_cfg: ModelConfig, lora: bool) -> torch.nn.Module:
    """The HF model in fp32 (master weights; bf16 compute comes from FSDP's mixed precision on GPU)."""
    overrides = dict(model_cfg.override_config)
    attn = overrides.pop("attn_implementation", "sdpa")
    model = AutoModelForCausalLM.from_pretrained(
        model_cfg.path, dtype=torch.float32, attn_implementation=attn,
        trust_remote_code=model_cfg.trust_remote_code,
    )
    for key, value in overrides.items():
        if not hasattr(model.config, key):
            raise ValueError(
                f"actor_rollout_ref.model.override_config.{key}: not a field of {type(model.config).__name__}"
            )
        setattr(model.config, key, value)
    if model_cfg.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not lora:
        return model
    target = model_cfg.target_modules
    peft_cfg = LoraConfig(
        r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=0.0, bias="none",
        target_modules=target if isinstance(target, str) else list(target), task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def shard_model(model: torch.nn.Module, fsdp_cfg: FSDPConfig, device: torch.device) -> torch.nn.Module:
    """FSDP2: one ``fully_shard`` unit per decoder layer plus the root, over a 1-D data-parallel mesh."""
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    offload = fsdp_cfg.param_offload or fsdp_cfg.optimizer_offload or fsdp_cfg.offload_policy
    kwargs: dict = {"mesh": mesh, "reshard_after_forward": fsdp_cfg.reshard_after_forward}
    if device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if offload:
            # FSDP2's CPUOffloadPolicy keeps sharded params, grads and hence the optimizer step on CPU.
            kwargs["offload_policy"] = CPUOffloadPolicy()
    else:
        model.to(device)
        if offload:
            log.info("fsdp_config param_offload/optimizer_offload/offload_policy: no-op on CPU "
                     "(weights and optimizer state already live in host memory)")
    layer_names = set(getattr(_hf_model(model), "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if type(module).__name__ in layer_names:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_policy(model_cfg: ModelConfig, fsdp_cfg: FSDPConfig, device: torch.device, seed: int) -> torch.nn.Module:
    """LoRA policy sharded over the process group; the same seed on every rank gives the same LoRA init."""
    torch.manual_seed(seed)
    model = load_base_model(model_cfg, lora=model_cfg.lora_rank > 0)
    return shard_model(model, fsdp_cfg, device)


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def response_logprobs(
    model: torch.nn.Module, mb: MicroBatch, device: torch.device, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens under ``model``: ``[B, R]`` each, 0 past the end.

    Logits are divided by the rollout temperature, as verl does, so they match the sampling policy.
    """
    out = model(
        input_ids=mb.input_ids.to(device),
        position_ids=mb.position_ids.to(device),
        attention_mask=None if mb.attention_mask is None else mb.attention_mask.to(device),
        use_cache=False,
    )
    vocab = out.logits.shape[-1]
    rows = out.logits.reshape(-1, vocab)[mb.pred_index[mb.valid].to(device)].float()  # [M, V]
    if temperature > 0:
        rows = rows / temperature
    lp = logprobs_from_logits(rows, mb.labels[mb.valid].to(device))  # [M]
    log_prob = rows.new_zeros(mb.valid.shape)  # [B, R]
    log_prob[mb.valid.to(device)] = lp
    if not with_entropy:
        return log_prob, None
    entropy = rows.new_zeros(mb.valid.shape)  # [B, R]
    entropy[mb.valid.to(device)] = entropy_from_logits(rows)
    return log_prob, entropy


def gather_adapter(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The peft adapter state dict on rank 0 (None elsewhere). A collective: every rank must call it."""
    full = get_model_state_dict(model, options=_FULL_TRAINABLE)
    if dist.get_rank() != 0:
        return None
    return {k: v.contiguous() for k, v in get_peft_model_state_dict(model, state_dict=full).items()}


def save_adapter(model: torch.nn.Module, adapter: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write a peft ``save_pretrained``-compatible folder atomically (rollout servers never see half of one)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.peft_config["default"].save_pretrained(str(tmp))
    save_file(adapter, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """Full trainable weights and optimizer state on rank 0 (None elsewhere). A collective."""
    weights = get_model_state_dict(model, options=_FULL_TRAINABLE)
    optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": weights, "optimizer": optim} if dist.get_rank() == 0 else None


def load_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Every rank passes the full state; each keeps its own shard."""
    opts = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, state["model"], options=opts)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))


def write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
