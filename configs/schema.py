"""The whole experiment config and its cross-field rules (configs layer)."""

from __future__ import annotations

import warnings
from typing import ClassVar

from pydantic import Field, model_validator

from configs.actor import ActorConfig, ModelConfig, RefConfig
from configs.base import ConfigWarning, Section
from configs.rollout import RolloutConfig
from configs.sections import (
    AgentLightningConfig,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    RewardConfig,
    RewardModelConfig,
    ServeConfig,
    SFTConfig,
    StreamConfig,
    ToolsConfig,
    TrackingConfig,
    TrainerConfig,
)


class ActorRolloutRefConfig(Section):
    """verl's ``actor_rollout_ref``: the model, the trained actor, the reference policy and the rollout."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset({"hybrid_engine", "nccl_timeout"})

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The base model and its LoRA adapter."""
    actor: ActorConfig = Field(default_factory=ActorConfig)
    """The policy being trained."""
    ref: RefConfig = Field(default_factory=RefConfig)
    """The reference policy (base weights, adapter disabled)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Rollout engines and agent loops."""


class TandemConfig(Section):
    """One experiment: verl's sections plus tandem-rl's serve/stream/tools/tracking/sft."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"sandbox_fusion", "skip", "critic", "ray_kwargs", "ray_init", "global_profiler",
         "transfer_queue", "model_engine", "hydra", "defaults", "distillation"}
    )

    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantage estimation."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Datasets and length limits."""
    actor_rollout_ref: ActorRolloutRefConfig = Field(default_factory=ActorRolloutRefConfig)
    """Model, actor, reference and rollout."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Run length, workers, checkpoints, loggers."""
    serve: ServeConfig = Field(default_factory=ServeConfig)
    """Ray Serve rollout app."""
    stream: StreamConfig = Field(default_factory=StreamConfig)
    """Streaming trajectory buffer and staleness bound."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """Tool runtime."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """mlflow and Ray metrics."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    """Optional SFT cold start."""
    custom_reward_function: CustomRewardFunctionConfig = Field(default_factory=CustomRewardFunctionConfig)
    """A user's reward function file (verl's top-level key)."""
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    """verl's legacy reward section: ``reward_kwargs`` only."""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    """verl 0.9's reward section: ``custom_reward_function`` only."""
    agent_lightning: AgentLightningConfig = Field(default_factory=AgentLightningConfig)
    """Agent Lightning 1.x agents driven through an ``agl-server`` (the ``agent_lightning`` agent loop)."""

    @property
    def reward_function(self) -> CustomRewardFunctionConfig | None:
        """The custom reward function in effect (top-level, else ``reward.``), with ``reward_model.reward_kwargs``
        merged under its own; None when neither names a path."""
        chosen = self.custom_reward_function if self.custom_reward_function.path else self.reward.custom_reward_function
        if not chosen.path:
            return None
        return chosen.model_copy(update={"reward_kwargs": {**self.reward_model.reward_kwargs, **chosen.reward_kwargs}})

    @model_validator(mode="after")
    def _cross_field_rules(self) -> TandemConfig:
        data, rollout, actor = self.data, self.actor_rollout_ref.rollout, self.actor_rollout_ref.actor
        for key, mirror, value in (
            ("prompt_length", "max_prompt_length", data.max_prompt_length),
            ("response_length", "max_response_length", data.max_response_length),
        ):
            given = getattr(rollout, key)
            if given is not None and given != value:
                raise ValueError(
                    f"actor_rollout_ref.rollout.{key}={given} disagrees with data.{mirror}={value}; "
                    f"set only data.{mirror}"
                )
        needed = data.max_prompt_length + data.max_response_length
        if rollout.max_model_len is not None and rollout.max_model_len < needed:
            raise ValueError(
                f"actor_rollout_ref.rollout.max_model_len={rollout.max_model_len} is smaller than "
                f"data.max_prompt_length + data.max_response_length = {needed}"
            )
        engine_len = rollout.engine_kwargs.get(rollout.name, {}).get("max_model_len")
        if engine_len is not None and int(engine_len) < needed:
            warnings.warn(
                f"engine_kwargs.{rollout.name}.max_model_len={engine_len} < max_prompt_length + "
                f"max_response_length = {needed}: long episodes will end with termination max_model_len",
                ConfigWarning,
                stacklevel=2,
            )
        if actor.ppo_mini_batch_size > data.train_batch_size:
            # verl rejects this; we run one optimizer step per batch and say so.
            warnings.warn(
                f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} prompts exceeds data.train_batch_size="
                f"{data.train_batch_size} (= {data.train_batch_size * rollout.n} trajectories with rollout.n="
                f"{rollout.n}); each step uses the whole batch as one mini-batch",
                ConfigWarning,
                stacklevel=2,
            )
        elif data.train_batch_size % actor.ppo_mini_batch_size:
            raise ValueError(
                f"data.train_batch_size × rollout.n = {data.train_batch_size * rollout.n} trajectories is not a "
                f"multiple of actor.ppo_mini_batch_size × rollout.n = {actor.ppo_mini_batch_size * rollout.n}"
            )
        trainer = self.trainer
        validates = [k for k, on in (("trainer.val_before_train", trainer.val_before_train),
                                     (f"trainer.test_freq={trainer.test_freq}", trainer.test_freq > 0),
                                     ("trainer.val_only", trainer.val_only)) if on]
        if validates and data.val_files is None:
            raise ValueError(f"{' and '.join(validates)} need data.val_files (validation rows); set data.val_files "
                             "or turn validation off")
        if self.serve.min_replicas > self.serve.max_replicas:
            raise ValueError(
                f"serve.min_replicas={self.serve.min_replicas} > serve.max_replicas={self.serve.max_replicas}"
            )
        if self.algorithm.adv_estimator == "grpo" and rollout.n < 2:
            raise ValueError("GRPO needs actor_rollout_ref.rollout.n >= 2 samples per prompt")
        parser = rollout.tool_call_parser
        if parser is not None and parser != rollout.multi_turn.format:
            warnings.warn(
                f"engine_kwargs.vllm.tool_call_parser={parser} (the OpenAI endpoint) differs from "
                f"multi_turn.format={rollout.multi_turn.format} (what agent loops parse)",
                ConfigWarning,
                stacklevel=2,
            )
        agl = self.agent_lightning
        if agl.store_url and (agl.server_url or agl.agent_class):
            raise ValueError("agent_lightning.store_url (Agent Lightning 0.3.x, whose runners run the agent) and "
                             "agent_lightning.server_url / agent_class (1.x's agl-server and the agent agl-controller "
                             "runs) are two ways to reach Agent Lightning: set one")
        if agl.store_url:
            unused = sorted(k for k in ("api_key_env", "model_name", "env_map", "keep_rollouts", "poll_interval_s")
                            if k in agl.model_fields_set)
            if unused:
                warnings.warn(f"agent_lightning.{', agent_lightning.'.join(unused)}: settings of a 1.x agl-server, "
                              "unused with agent_lightning.store_url (0.3.x); ignored", ConfigWarning, stacklevel=2)
        if rollout.agent.default_agent_loop == "agent_lightning" and not (
                agl.store_url or (agl.server_url and agl.agent_class)):
            raise ValueError("default_agent_loop=agent_lightning needs agent_lightning.server_url (agl-server) and "
                             "agent_lightning.agent_class (the agent agl-controller runs), or agent_lightning.store_url "
                             "(an Agent Lightning 0.3.x store, which tandem_rl_agl.TandemRL sets)")
        if agl.server_url and agl.agent_class and self.serve.api_key_env:
            # agentlightning 1.0.2's proxy (server/proxy.py) posts to the registered endpoint with a content-type header
            # only: with a token required, every agent call would come back 401 and every rollout fail
            raise ValueError(
                f"serve.api_key_env={self.serve.api_key_env} makes the OpenAI ingress require a bearer token, but "
                "agl-server's proxy (agentlightning 1.0.2) forwards agents' calls without any Authorization header, so "
                "each would be refused: with agent_lightning.server_url set, leave serve.api_key_env unset and keep "
                "serve.host on loopback (protect agl-server itself with its key: agent_lightning.api_key_env)")
        return self

    @property
    def max_model_len(self) -> int:
        """Context length the engines serve."""
        rollout = self.actor_rollout_ref.rollout
        engine_len = rollout.engine_kwargs.get(rollout.name, {}).get("max_model_len")
        return int(
            rollout.max_model_len or engine_len or self.data.max_prompt_length + self.data.max_response_length
        )

    @property
    def tool_config_path(self) -> str | None:
        return self.actor_rollout_ref.rollout.multi_turn.tool_config_path or self.tools.config_path
