"""``actor_rollout_ref.{model,actor,ref}`` with verl's key names (configs layer)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from configs.base import Section

# The policy losses verl 0.9.1 registers in core_algos (kept as data so configs stay torch-free).
LossMode = Literal[
    "vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro", "cispo", "dppo_tv", "dppo_kl",
]
KlType = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]
LossAggMode = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]


class ModelConfig(Section):
    """``actor_rollout_ref.model``: the base model, its tokenizer, and the LoRA adapter trained on it."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"mtp", "lora", "external_lib", "use_shm", "enable_activation_offload", "use_liger", "use_fused_kernels",
         "fused_kernel_options", "exclude_modules", "custom_chat_template",
         "use_dynamic_bsz", "layered_summon", "hf_config_path", "tiled_mlp"}
    )

    path: str = ".cache/tiny-model"
    """Base model: a local Hugging Face folder or a hub id."""
    tokenizer_path: str | None = None
    """Tokenizer folder or hub id (default: ``path``)."""
    lora_rank: int = Field(default=16, ge=0, le=1024)
    """LoRA rank; 0 trains all weights (SFT only; GRPO trains adapters)."""
    lora_alpha: int = Field(default=32, ge=1)
    """LoRA scaling alpha."""
    lora_adapter_path: str | None = None
    """A saved peft LoRA adapter (e.g. ``runs/<name>/adapters/v<k>``) to start from: training continues it and
    validation evaluates it. It is policy version 0 on every rollout replica; its own rank/alpha/targets win."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get LoRA adapters (peft's ``all-linear`` = every linear layer but the head)."""
    use_remove_padding: bool = True
    """Pack sequences without padding where the model supports it."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    override_config: dict[str, Any] = Field(default_factory=dict)
    """Overrides applied to the HF model config (e.g. ``attn_implementation: sdpa``)."""
    trust_remote_code: bool = False
    """Allow custom modelling code from the model folder."""


class OptimConfig(Section):
    """``actor.optim``: the learner's AdamW optimizer and its learning-rate schedule."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"zero_indexed_step", "num_cycles", "optimizer", "optimizer_impl", "override_optimizer_config", "clip_grad"}
    )

    lr: float = Field(default=1e-5, ge=0, le=1)
    """Learning rate (0 keeps the weights: a control run that shows what the updates change)."""
    lr_warmup_steps: int = -1
    """Warm-up steps; -1 uses ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = Field(default=0.0, ge=0, le=1)
    """Warm-up as a share of total steps."""
    warmup_style: Literal["constant", "cosine"] | None = None
    """Deprecated verl spelling of ``lr_scheduler_type``."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """Schedule after warm-up."""
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    """Cosine floor as a share of ``lr``."""
    weight_decay: float = Field(default=0.01, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    total_training_steps: int = -1
    """Set by the trainer from the data size; -1 = derive."""


class MixedPrecisionConfig(Section):
    """verl's ``fsdp_config.mixed_precision``: the learner's compute dtype."""

    ONLY_DEFAULT: ClassVar[dict[str, str]] = {
        "reduce_dtype": "gradients are reduced in fp32 (the only choice here)",
        "buffer_dtype": "buffers stay fp32 (the only choice here)",
    }

    param_dtype: Literal["bf16", "fp32"] | None = None
    """Dtype of the forward and backward. Default: bf16 on GPU (FSDP2's MixedPrecisionPolicy), fp32 on CPU. bf16 on
    CPU runs them under ``torch.autocast`` (weights, gradients and optimizer state stay fp32): 2.4x faster
    forward+backward for Qwen2.5-0.5B with LoRA on a 2-core avx512_bf16 CPU, at bf16's rounding of the log-probs."""
    reduce_dtype: Literal["fp32"] = "fp32"
    """Dtype gradients are reduced in across workers (fp32 only)."""
    buffer_dtype: Literal["fp32"] = "fp32"
    """Dtype of the model's buffers (fp32 only)."""

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        aliases = {"bfloat16": "bf16", "float32": "fp32"}
        if isinstance(data, dict):
            return {k: aliases.get(v, v) if isinstance(v, str) else v for k, v in data.items()}
        return data


class FSDPConfig(Section):
    """``actor.fsdp_config`` (and ``ref.fsdp_config``): how the learner shards the model with FSDP2, what it
    offloads to CPU, and its compute dtype."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"full_determinism", "entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size",
         "use_torch_compile", "use_no_sync_for_gradient_accumulation", "pad_to_length", "pad_to_length_bucket", "qat",
         "turbo_config", "wrap_policy", "forward_prefetch", "use_orig_params", "model_dtype",
         "dtype",
         "entropy_checkpointing", "ulysses_sequence_parallel_size", "forward_only", "strategy", "seed",
         "fsdp_size"}
    )

    param_offload: bool = False
    """Offload parameters to CPU (GPU only; a no-op with a log line on CPU)."""
    optimizer_offload: bool = False
    """Offload optimizer state to CPU (GPU only; a no-op with a log line on CPU)."""
    offload_policy: bool = False
    """FSDP2 CPUOffloadPolicy (GPU only)."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered parameters after forward."""
    mixed_precision: MixedPrecisionConfig = Field(default_factory=MixedPrecisionConfig)
    """The learner's compute dtype (``param_dtype``)."""


class PolicyLossConfig(Section):
    """``actor.policy_loss``: which of verl's policy losses the learner uses."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"dro_beta", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub",
                                                              "kl_cov_ratio", "ppo_kl_coef"})

    loss_mode: LossMode = "vanilla"
    """verl policy loss (``core_algos.get_policy_loss_fn``)."""


class ActorConfig(Section):
    """``actor_rollout_ref.actor``: the policy update — mini- and micro-batches, PPO clipping, KL and entropy terms,
    the optimizer and the sharding."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"entropy_from_logits_chunk_size", "pad_to_length", "checkpoint", "use_torch_compile",
         "ulysses_sequence_parallel_size", "use_fused_kernels", "profiler",
         "data_loader_seed", "entropy_from_logits_with_chunking", "entropy_checkpointing", "freeze_vision_tower",
         "loss_scale_factor", "calculate_sum_pi_squared", "tau_pos", "tau_neg",
         "ppo_infer_micro_batch_size_per_gpu", "ppo_infer_max_token_len_per_gpu", "qat", "rollout_n",
         "use_remove_padding", "engine", "router_replay", "grad_norm_threshold"}
    )
    NO_EFFECT: ClassVar[dict[str, str]] = {"strategy": "the learner always shards with FSDP2 (fully_shard)"}

    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    """Training strategy; both map to FSDP2 ``fully_shard`` (``fsdp`` is accepted for verl configs)."""
    ppo_mini_batch_size: int = Field(default=4, ge=1)
    """Prompts (groups) per optimizer step, as in verl: one mini-batch is ``× rollout.n`` trajectories."""
    ppo_micro_batch_size: int | None = Field(default=None, ge=1)
    """Deprecated verl key; use ``ppo_micro_batch_size_per_gpu``."""
    ppo_micro_batch_size_per_gpu: int | None = Field(default=None, ge=1)
    """Trajectories per forward/backward on one worker (fixed micro-batches; default 2)."""
    use_dynamic_bsz: bool = False
    """Token-budget micro-batches (``ppo_max_token_len_per_gpu``) instead of a fixed count."""
    ppo_max_token_len_per_gpu: int = Field(default=16384, ge=1)
    """Token budget of one micro-batch with ``use_dynamic_bsz``."""
    use_prefix_grouper: bool = True
    """Lay out each distinct prompt of a micro-batch once, followed by the responses of every sample that
    has it, with a 4-D attention mask (``trainers.prefix``); log-probs and gradients equal the unshared
    layout's. Default on, by measurement (SmolLM2-135M, LoRA r=8, 2 CPU cores, forward+backward of 2 groups
    × 8 samples, 214-token prompts, 20–40-token responses): 19.8 s → 5.8 s with micro-batches of 8, 26.5 s
    → 6.2 s with 16, 18.8 s → 12.2 s with 2 (verl's default size). No shared prompt: same time; responses
    much longer than the prompt (64 vs 200–400 tokens): 3% slower, as a whole group becomes one dense
    attention row. Needs ``attn_implementation`` sdpa or eager; replaces the packed/padded layout
    (``model.use_remove_padding``) when on."""
    ppo_epochs: int = Field(default=1, ge=1, le=100)
    """Passes over each batch."""
    shuffle: bool = False
    """Shuffle trajectories between mini-batches."""
    clip_ratio: float = Field(default=0.2, gt=0, le=10)
    """PPO clip ratio (default for ``clip_ratio_low``/``clip_ratio_high``)."""
    clip_ratio_low: float | None = Field(default=None, gt=0, le=10)
    """Lower clip ratio (default ``clip_ratio``)."""
    clip_ratio_high: float | None = Field(default=None, gt=0, le=10)
    """Upper clip ratio (default ``clip_ratio``; DAPO's clip-higher uses e.g. 0.28)."""
    clip_ratio_c: float = Field(default=3.0, gt=1)
    """Dual-clip constant for negative advantages."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How token losses aggregate (verl ``agg_loss``)."""
    entropy_coeff: float = Field(default=0.0, ge=0)
    """Entropy bonus coefficient."""
    calculate_entropy: bool = True
    """Compute entropy for metrics even when ``entropy_coeff`` is 0."""
    use_kl_loss: bool = False
    """Add a KL loss against the reference (the base model with the adapter disabled)."""
    kl_loss_coef: float = Field(default=0.001, ge=0)
    """KL loss coefficient."""
    kl_loss_type: KlType = "low_var_kl"
    """verl ``kl_penalty`` estimator."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Gradient norm clip."""
    tis_imp_ratio_cap: float = -1.0
    """Truncated importance sampling against rollout log-probs, capped at this ratio (<= 0 disables)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    policy_loss: PolicyLossConfig = Field(default_factory=PolicyLossConfig)
    """Policy loss selection."""

    @model_validator(mode="after")
    def _micro_batch(self) -> ActorConfig:
        if self.ppo_micro_batch_size is not None and self.ppo_micro_batch_size_per_gpu is not None:
            raise ValueError(
                "set only one of actor.ppo_micro_batch_size (deprecated) and actor.ppo_micro_batch_size_per_gpu"
            )
        return self

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    @property
    def micro_batch_size(self) -> int:
        return self.ppo_micro_batch_size_per_gpu or self.ppo_micro_batch_size or 2


class RefConfig(Section):
    """The reference policy is the base model with the LoRA adapter disabled: no second copy."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"entropy_from_logits_chunk_size", "pad_to_length", "strategy", "ulysses_sequence_parallel_size",
         "use_torch_compile", "entropy_from_logits_with_chunking",
         "entropy_checkpointing", "profiler", "model", "rollout_n"}
    )
    NO_EFFECT: ClassVar[dict[str, str]] = {
        key: "reference log-probs are computed inside the actor's micro-batches (actor.ppo_micro_batch_size_per_gpu, "
             "actor.use_dynamic_bsz)"
        for key in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                    "log_prob_max_token_len_per_gpu")}

    log_prob_micro_batch_size: int | None = Field(default=None, ge=1)
    """Deprecated verl key; use ``log_prob_micro_batch_size_per_gpu``."""
    log_prob_micro_batch_size_per_gpu: int | None = Field(default=None, ge=1)
    """Micro-batch size of reference log-prob passes (default: the actor's)."""
    log_prob_use_dynamic_bsz: bool = False
    """Token-budget micro-batches for reference log-probs."""
    log_prob_max_token_len_per_gpu: int = Field(default=16384, ge=1)
    """Token budget per reference micro-batch."""
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)
    """Accepted for verl configs; the reference shares the actor's sharded weights."""
