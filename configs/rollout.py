"""``actor_rollout_ref.rollout`` and its sub-sections, with verl's key names (configs layer)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from configs.base import ConfigWarning, Section
from configs.sections import Placement

ParserName = Literal["qwen25_coder", "hermes", "qwen3_xml"]
AgentLoopName = Literal["single_turn_agent", "tool_agent", "tool_agent_loop", "langgraph_sql", "agent_lightning"]


VERL_ONLY_ENGINES = ("sglang", "trtllm")  # verl's engines tandem-rl does not have: their kwargs load, unused


class MultiTurnConfig(Section):
    """``rollout.multi_turn``: tool use within an episode — the tool-call format, turn limits, tool responses and
    timeouts."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"function_tool_path", "num_repeat_rollouts", "interaction_config_path", "use_inference_chat_template",
         "tokenization_sanity_check_mode",
         "completion_callback", "max_turns"}
    )
    NO_EFFECT: ClassVar[dict[str, str]] = {
        "enable": "the agent loop is chosen by actor_rollout_ref.rollout.agent.default_agent_loop (single_turn_agent: "
                  "no tools) or a row's agent_name"}

    enable: bool = True
    """verl's switch for multi-turn rollouts; here the agent loop decides (see ``NO_EFFECT``)."""
    format: ParserName = "qwen25_coder"
    """Tool-call format the agent loop parses: ``qwen25_coder`` (universal, default), ``hermes``
    (strict ``<tool_call>`` JSON) or ``qwen3_xml``."""
    max_assistant_turns: int | None = Field(default=None, ge=1)
    """Stop an episode after this many model turns (None = only the token budget limits it)."""
    max_user_turns: int | None = Field(default=None, ge=1)
    """Stop after this many user/tool turns appended to the conversation."""
    max_parallel_calls: int = Field(default=1, ge=1, le=64)
    """At most this many tool calls of one turn run (concurrently); extra calls get an error."""
    max_tool_response_length: int = Field(default=256, ge=1)
    """Tool responses longer than this many characters are truncated."""
    tool_response_truncate_side: Literal["left", "right", "middle"] = "middle"
    """``left`` drops the start (keeps the end), ``right`` keeps the start, ``middle`` keeps both ends."""
    tool_config_path: str | None = None
    """verl-style tool config YAML (``tools: [{class_name, config, tool_schema}]``)."""
    on_parse_error: Literal["feedback", "stop"] = "feedback"
    """An undecodable tool call is fed back to the model as an error message, or ends the episode."""
    tool_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """Wall-clock limit of one tool call; a timeout becomes an error tool message."""


class AgentConfig(Section):
    """``rollout.agent``: the agent workers that run episodes — how many, episodes each, the default loop, placement."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"agent_loop_config_path", "custom_async_server"})

    num_workers: int = Field(default=2, ge=1, le=1024)
    """Agent worker actors; each runs many episodes at once."""
    default_agent_loop: AgentLoopName = "single_turn_agent"
    """Loop used for rows that carry no ``agent_name``."""
    max_concurrent_episodes: int = Field(default=64, ge=1, le=10_000)
    """Episodes one agent worker runs concurrently."""
    placement: Placement = Field(default_factory=Placement)
    """Where agent workers run (Ray actor options ``resources``, ``label_selector``): they run the tools, so
    place them where the tool assets are."""


class ValKwargs(Section):
    """``rollout.val_kwargs``: how validation samples (greedy by default)."""

    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature for validation (0 = greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling for validation."""
    top_k: int = -1
    """Top-k for validation; -1 disables it."""
    n: int = Field(default=1, ge=1)
    """Samples per validation prompt."""
    do_sample: bool = False
    """Sample during validation (False = greedy)."""


class TraceConfig(Section):
    """``rollout.trace``: agent-loop traces — where they go and how many episodes per step are traced."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"project_name", "experiment_name", "max_samples_per_step_per_worker"})

    backend: Literal["mlflow", "none"] = "mlflow"
    """Where agent-loop traces go (verl's ``rollout.trace.backend``)."""
    token2text: bool = False
    """Also decode token ids to text in span inputs/outputs."""
    max_samples_per_step: int = Field(default=8, ge=0)
    """Trace at most this many episodes per training step (0 = none)."""


class RolloutConfig(Section):
    """``actor_rollout_ref.rollout``: the rollout engine, its sampling, lengths and memory, and the agent-loop
    sections (``multi_turn``, ``agent``, ``val_kwargs``, ``trace``)."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"nnodes", "n_gpus_per_node", "full_determinism", "seed", "logprobs_mode", "scheduling_policy",
         "multi_stage_wake_up", "router_config_path", "moe_load_balance_metrics_interval", "quantization_config_file",
         "mtp", "qat", "disaggregation", "ignore_eos", "free_cache_engine", "load_format", "disable_log_stats",
         "enable_chunked_prefill",
         "max_num_batched_tokens", "cudagraph_capture_sizes", "layered_summon", "update_weights_bucket_megabytes",
         "skip_rollout", "skip_dump_dir", "over_sample_rate", "expert_parallel_size", "data_parallel_size",
         "pipeline_model_parallel_size", "profiler", "mode_kwargs", "enable_prefix_caching", "checkpoint_engine",
         "layer_name_map", "quantization", "skip_tokenizer_init", "sglang_rollout_mode", "update_weights_mode",
         "agent_loop_workers", "custom", "prometheus", "server", "enable_rollout_routing_replay"}
    )
    NO_EFFECT: ClassVar[dict[str, str]] = {
        **{key: "the engines return each token's log-prob as they sample it; the learner's old log-probs come from "
                "its own micro-batches (actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz)"
           for key in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                       "log_prob_max_token_len_per_gpu")},
        "calculate_log_probs": "the engines always return rollout log-probs (truncated IS and partial rollouts need "
                               "them)"}

    name: Literal["vllm", "hf"] = "hf"
    """Inference engine: ``hf`` (transformers, CPU default) or ``vllm`` (GPU)."""
    mode: Literal["async", "sync"] = "async"
    """Always ``async``: rollouts are served by Ray Serve and driven by asyncio agent loops."""
    n: int = Field(default=4, ge=1, le=1024)
    """Samples per prompt (the GRPO group size)."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature for training rollouts."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling."""
    top_k: int = -1
    """Top-k sampling; -1 disables it."""
    do_sample: bool = True
    """Sample (False = greedy)."""
    prompt_length: int | None = Field(default=None, ge=1)
    """verl mirror of ``data.max_prompt_length``; must agree with it when given."""
    response_length: int | None = Field(default=None, ge=1)
    """verl mirror of ``data.max_response_length``; must agree with it when given."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context length of the engine; default ``max_prompt_length + max_response_length``."""
    dtype: Literal["bfloat16", "float16", "float32", "auto"] = "auto"
    """Engine weight dtype (``auto``: bf16 on GPU, fp32 on CPU)."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """Share of GPU memory vLLM may take."""
    tensor_model_parallel_size: int = Field(default=1, ge=1)
    """vLLM tensor parallel size per replica."""
    log_prob_micro_batch_size: int | None = Field(default=None, ge=1)
    """Deprecated verl key; use ``log_prob_micro_batch_size_per_gpu``."""
    log_prob_micro_batch_size_per_gpu: int | None = Field(default=None, ge=1)
    """Micro-batch size when recomputing old log-probs."""
    log_prob_use_dynamic_bsz: bool = False
    """Token-budget micro-batches for log-prob recomputation."""
    log_prob_max_token_len_per_gpu: int = Field(default=16384, ge=1)
    """Token budget per micro-batch for log-prob recomputation."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs."""
    max_num_seqs: int = Field(default=256, ge=1)
    """Most sequences an engine batches at once (HF engine batch size on CPU)."""
    calculate_log_probs: bool = True
    """Return rollout log-probs (needed for truncated importance sampling and the log-prob gap metric)."""
    engine_kwargs: dict[str, dict[str, Any]] = Field(default_factory=lambda: {"vllm": {}, "hf": {}})
    """Passed through to the engine: ``engine_kwargs.vllm`` to vLLM's engine args, ``engine_kwargs.hf``
    to the transformers engine (``HFEngine``'s options, e.g. ``prefix_cache_mib``, ``prefix_cache_min_tokens``,
    ``attn_implementation``; a key it does not take is rejected when the rollout app is built)."""
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    """Multi-turn tool use."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Agent workers and the default agent loop."""
    val_kwargs: ValKwargs = Field(default_factory=ValKwargs)
    """Sampling for validation."""
    trace: TraceConfig = Field(default_factory=TraceConfig)
    """Agent-loop tracing."""

    @field_validator("mode")
    @classmethod
    def _async_only(cls, mode: str) -> str:
        if mode == "sync":
            raise ValueError(
                "actor_rollout_ref.rollout.mode=sync is not supported: rollouts in tandem-rl are always "
                "server-based and asynchronous (Ray Serve engines driven by asyncio agent loops); "
                "remove the key or set mode=async"
            )
        return mode

    @field_validator("engine_kwargs")
    @classmethod
    def _known_engines(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        unknown = set(value) - {"vllm", "hf", *VERL_ONLY_ENGINES}
        if unknown:
            raise ValueError(f"engine_kwargs has unknown engine(s) {sorted(unknown)}; expected vllm or hf")
        for engine in VERL_ONLY_ENGINES:
            if value.get(engine):
                warnings.warn(f"actor_rollout_ref.rollout.engine_kwargs.{engine}: tandem-rl has no {engine} engine; "
                              "ignored", ConfigWarning, stacklevel=2)
        return {"vllm": {}, "hf": {}, **{k: dict(v or {}) for k, v in value.items() if k not in VERL_ONLY_ENGINES}}

    @property
    def tool_call_parser(self) -> str | None:
        """The parser vLLM's OpenAI server is told to use, if any."""
        return self.engine_kwargs.get("vllm", {}).get("tool_call_parser")
