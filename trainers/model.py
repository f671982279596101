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
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, PeftConfig, PeftModel, PeftType, get_peft_model, get_peft_model_state_dict
from safetensors import safe_open
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
from transformers import AutoConfig, AutoModelForCausalLM

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


def load_base_model(model_cfg: ModelConfig, lora: bool, adapter_path: str | None = None) -> torch.nn.Module:
    """The HF model in fp32 (master weights; bf16 compute comes from FSDP's mixed precision on GPU), with a
    fresh LoRA adapter, or the saved one at ``adapter_path`` (trainable) when given."""
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
    if adapter_path is not None:
        if not lora:
            raise ValueError(f"actor_rollout_ref.model.lora_adapter_path={adapter_path!r} needs lora_rank > 0")
        return _load_adapter(model, model_cfg, adapter_path)
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
        param_dtype = torch.float32 if fsdp_cfg.mixed_precision.param_dtype == "fp32" else torch.bfloat16
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
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


def build_policy(
    model_cfg: ModelConfig, fsdp_cfg: FSDPConfig, device: torch.device, seed: int, adapter_path: str | None = None
) -> torch.nn.Module:
    """LoRA policy sharded over the process group; the same seed on every rank gives the same LoRA init.
    Training starts from the saved adapter ``adapter_path`` (default: ``model.lora_adapter_path``) if any."""
    torch.manual_seed(seed)
    adapter_path = adapter_path or model_cfg.lora_adapter_path
    model = load_base_model(model_cfg, lora=model_cfg.lora_rank > 0, adapter_path=adapter_path)
    return shard_model(model, fsdp_cfg, device)


_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # peft's two file names
_LORA_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude_vector")


def _adapter_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of the adapter's weights file, without reading the tensors (safetensors)."""
    safetensors = folder / _ADAPTER_WEIGHTS[0]
    if safetensors.is_file():
        with safe_open(str(safetensors), framework="pt") as fh:
            return {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}
    state = torch.load(folder / _ADAPTER_WEIGHTS[1], map_location="meta", weights_only=True, mmap=True)
    return {k: tuple(v.shape) for k, v in state.items()}


def _lora_shape_error(module: torch.nn.Module, part: str, shape: tuple[int, ...]) -> str | None:
    """Why a LoRA tensor of ``shape`` cannot sit on ``module`` (None when it fits or is not checked)."""
    if isinstance(module, torch.nn.Linear):
        if part == ".lora_A." and shape[-1] != module.in_features:
            return f"lora_A has {shape[-1]} inputs, the module {module.in_features}"
        if part == ".lora_B." and shape[0] != module.out_features:
            return f"lora_B has {shape[0]} outputs, the module {module.out_features}"
    if isinstance(module, torch.nn.Embedding):
        if part == ".lora_embedding_A" and shape[-1] != module.num_embeddings:
            return f"lora_embedding_A covers {shape[-1]} tokens, the module {module.num_embeddings}"
        if part == ".lora_embedding_B" and shape[0] != module.embedding_dim:
            return f"lora_embedding_B has width {shape[0]}, the module {module.embedding_dim}"
    return None  # other module types (and DoRA magnitudes) are left to peft's own loading


def check_adapter(path: str | Path, model_path: str, trust_remote_code: bool = False) -> None:
    """Raise a ValueError naming ``path`` and what did not match unless it is a peft LoRA adapter for the
    base model at ``model_path``: config and weights files present, every target module and every adapter
    tensor's module present in the base model, and every tensor shape fitting its module.

    The base model is built from its config on the meta device (no weights are read), so a driver can
    call this before it starts workers.
    """
    folder = Path(path)
    where = f"LoRA adapter {str(path)!r}"
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{where}: no adapter_config.json (not a peft adapter folder)")
    peft_cfg = PeftConfig.from_pretrained(str(folder))
    if peft_cfg.peft_type != PeftType.LORA:
        raise ValueError(f"{where}: peft_type {peft_cfg.peft_type} is not LORA")
    if not any((folder / name).is_file() for name in _ADAPTER_WEIGHTS):
        raise ValueError(f"{where}: no adapter weights file ({' or '.join(_ADAPTER_WEIGHTS)})")
    hf_cfg = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(hf_cfg, trust_remote_code=trust_remote_code)
    modules = dict(base.named_modules())
    targets = peft_cfg.target_modules
    if targets is not None and not isinstance(targets, str):  # a str is a regex or "all-linear"
        missing = sorted(t for t in targets if not any(n == t or n.endswith("." + t) for n in modules))
        if missing:
            raise ValueError(f"{where}: target modules {missing} are not in the base model {model_path!r}")
    params = dict(base.named_parameters(remove_duplicate=False))
    for key, shape in _adapter_shapes(folder).items():
        name = key.removeprefix("base_model.model.")
        part = next((p for p in _LORA_PARTS if p in name), None)
        if part is None:  # a fully trained module (peft modules_to_save): the tensor replaces a base parameter
            param = params.get(name.replace(".modules_to_save", ""))
            why = "no such base parameter" if param is None else (
                None if tuple(param.shape) == shape else f"the base parameter is {list(param.shape)}")
        else:
            module_name = name.split(part)[0]
            if module_name not in modules:
                raise ValueError(f"{where}: tensor {key!r} is for module {module_name!r}, which the base model "
                                 f"{model_path!r} does not have")
            why = _lora_shape_error(modules[module_name], part, shape)
        if why:
            raise ValueError(f"{where}: tensor {key!r} {list(shape)} does not fit the base model {model_path!r}: {why}")


def _targeted(model: torch.nn.Module, target: str | list[str] | set[str] | None) -> frozenset[str]:
    """Names of the modules of ``model`` that ``target_modules`` selects, by peft's rules: ``all-linear`` is
    every linear layer but the output head, another string a full-match regex, a list exact names or
    ``.``-suffixes (peft saves ``all-linear`` expanded into full names, so only the selection compares)."""
    names = dict(model.named_modules())
    if target == "all-linear":
        head = model.get_output_embeddings()
        return frozenset(n for n, m in names.items() if isinstance(m, torch.nn.Linear) and m is not head)
    if isinstance(target, str):
        return frozenset(n for n in names if re.fullmatch(target, n))
    return frozenset(n for n in names if any(n == t or n.endswith("." + t) for t in target or ()))


def _load_adapter(model: torch.nn.Module, model_cfg: ModelConfig, path: str) -> torch.nn.Module:
    """The saved adapter, trainable, on ``model``; its rank, alpha and targets win over the config's."""
    check_adapter(path, model_cfg.path, model_cfg.trust_remote_code)
    saved = PeftConfig.from_pretrained(path)
    ours = (model_cfg.lora_rank, model_cfg.lora_alpha, _targeted(model, model_cfg.target_modules))
    theirs = (saved.r, saved.lora_alpha, _targeted(model, saved.target_modules))
    if ours != theirs:
        kinds = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in theirs[2]}))
        log.warning(
            "actor_rollout_ref.model.lora_adapter_path=%s has r=%d lora_alpha=%d on %d modules (%s); the config "
            "says lora_rank=%d lora_alpha=%d on %d modules (target_modules=%s): training with the adapter's",
            path, saved.r, saved.lora_alpha, len(theirs[2]), kinds,
            model_cfg.lora_rank, model_cfg.lora_alpha, len(ours[2]), model_cfg.target_modules,
        )
    return PeftModel.from_pretrained(model, path, is_trainable=True)


def _hf_model(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _attention_mask(model: torch.nn.Module, mb: MicroBatch, device: torch.device) -> torch.Tensor | None:
    """The micro-batch's mask as the model's attention implementation takes it. A 4-D mask (shared-prompt
    layout) is boolean, which sdpa takes as is; eager attention adds the mask to the scores, so it gets
    0 / -inf-like floats; flash kernels take no dense mask."""
    mask = mb.attention_mask
    if mask is None or mask.dim() == 2:
        return None if mask is None else mask.to(device)
    attn = _hf_model(model).config._attn_implementation
    if attn == "sdpa":
        return mask.to(device)
    if attn == "eager":
        additive = torch.zeros(mask.shape, dtype=torch.float32)  # [rows, 1, W, W]
        return additive.masked_fill_(~mask, torch.finfo(torch.float32).min).to(device)
    raise ValueError(
        f"actor_rollout_ref.actor.use_prefix_grouper needs attn_implementation sdpa or eager, not {attn!r} "
        "(set actor_rollout_ref.model.override_config.attn_implementation)"
    )


def cpu_autocast(fsdp_cfg: FSDPConfig, device: torch.device) -> bool:
    """Whether the forward runs under bf16 autocast: ``mixed_precision.param_dtype=bf16`` on a CPU (on a GPU FSDP2's
    MixedPrecisionPolicy casts the parameters instead)."""
    return device.type == "cpu" and fsdp_cfg.mixed_precision.param_dtype == "bf16"


def response_logprobs(
    model: torch.nn.Module, mb: MicroBatch, device: torch.device, temperature: float, with_entropy: bool,
    autocast: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens under ``model``: ``[B, R]`` each, 0 past the end.

    Logits are divided by the rollout temperature, as verl does, so they match the sampling policy.
    Only the columns that predict a response token go through the LM head (``logits_to_keep``): the
    ``[rows, cols, vocab]`` logits were the largest activation and a fifth of the forward+backward time
    of a 135M model with a 49k vocabulary. The kept columns are the union over rows (the HF models slice
    ``hidden[:, keep]``), a superset of what each row needs. ``autocast``: the model runs under bf16 autocast
    (``cpu_autocast``); the log-probs are computed from its logits in fp32.
    """
    width = mb.input_ids.shape[1]
    flat = mb.pred_index[mb.valid]  # [M] flat index into [rows*cols]
    keep, keep_of = torch.unique(flat % width, return_inverse=True)  # [K] columns, [M] each one's slot in keep
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(
            input_ids=mb.input_ids.to(device),
            position_ids=mb.position_ids.to(device),
            attention_mask=_attention_mask(model, mb, device),
            logits_to_keep=keep.to(device),
            use_cache=False,
        )
    vocab = out.logits.shape[-1]  # out.logits: [rows, K, V]
    index = (flat // width) * len(keep) + keep_of  # [M] flat index into [rows*K]
    rows = out.logits.reshape(-1, vocab)[index.to(device)].float()  # [M, V]
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
    """Write ``payload`` to ``path`` as indented JSON with sorted keys."""
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
