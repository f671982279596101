"""Top-level sections: verl's ``algorithm``, ``data``, ``trainer`` and tandem-rl's own ``serve``,
``stream``, ``tools``, ``tracking``, ``sft`` (configs layer)."""

from __future__ import annotations

import ipaddress
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from configs.base import Section


class AlgorithmConfig(Section):
    """verl's ``algorithm``: the advantage estimator (GRPO), its normalization, and KL in the reward."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"kl_ctrl", "use_pf_ppo", "pf_ppo", "filter_groups", "rollout_correction", "rollout_is",
         "rollout_is_threshold", "rollout_is_threshold_lower", "rollout_is_level", "rollout_is_mode",
         "rollout_is_veto_threshold", "bypass_mode"}
    )

    NO_EFFECT: ClassVar[dict[str, str]] = {
        "gamma": "GRPO's advantage is the group-normalized outcome reward (no discounting, as in verl's GRPO)",
        "lam": "GRPO has no GAE (as in verl's GRPO)"}

    adv_estimator: Literal["grpo"] = "grpo"
    """Advantage estimator; tandem-rl implements GRPO (verl ``compute_grpo_outcome_advantage``)."""

    @field_validator("adv_estimator", mode="before")
    @classmethod
    def _grpo_only(cls, value: Any) -> Any:
        if value != "grpo":
            raise ValueError(f"{value!r}: tandem-rl trains critic-free GRPO only (verl's default in its full config is "
                             "gae, PPO with a critic); set algorithm.adv_estimator=grpo")
        return value
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-centred rewards by the group std (False = Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """KL in the reward is not implemented; use ``actor.use_kl_loss``."""
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"] = "kl"
    """Estimator for an in-reward KL (unused while ``use_kl_in_reward`` is False)."""
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount (unused by GRPO; accepted for verl configs)."""
    lam: float = Field(default=1.0, ge=0, le=1)
    """GAE lambda (unused by GRPO; accepted for verl configs)."""

    @field_validator("use_kl_in_reward")
    @classmethod
    def _no_kl_in_reward(cls, value: bool) -> bool:
        if value:
            raise ValueError("algorithm.use_kl_in_reward=true is not implemented; use actor.use_kl_loss=true")
        return value


class DataConfig(Section):
    """verl's ``data``: the training and validation rows, batch size, prompt and response lengths, shuffling."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"function_tool_path", "return_raw_input_ids", "audio_key", "mm_processor_kwargs", "tokenizer", "use_shm",
         "dataloader_num_workers", "image_key", "video_key", "custom_cls", "sampler",
         "datagen", "return_full_prompt", "return_multi_modal_inputs", "filter_overlong_prompts_workers",
         "trust_remote_code", "apply_chat_template_kwargs", "gen_batch_size", "validation_shuffle",
         "seed", "tool_config_path", "max_samples", "train_max_samples", "val_max_samples", "image_patch_size"}
    )
    ONLY_DEFAULT: ClassVar[dict[str, str]] = {
        "prompt_key": "rows keep their chat messages under 'prompt' (verl's RLHFDataset layout); rename the column",
        "reward_fn_key": "rewards are chosen by each row's 'data_source' (or custom_reward_function); rename the column"}

    train_files: str | list[str] = "data/gsm8k/train.parquet"
    """Training rows (parquet or jsonl), one file or a list."""
    val_files: str | list[str] | None = None
    """Validation rows (parquet or jsonl)."""
    prompt_key: str = "prompt"
    """Row key holding the chat messages."""
    reward_fn_key: str = "data_source"
    """Row key that selects the reward function."""
    train_batch_size: int = Field(default=8, ge=1)
    """Prompts (groups) per training step; each yields ``rollout.n`` trajectories."""
    val_batch_size: int | None = Field(default=None, ge=1)
    """Validation prompts in flight at once (default: all); every validation prompt is always run."""
    max_prompt_length: int = Field(default=1024, ge=1)
    """Longest prompt in tokens (chat template and tool schemas included)."""
    max_response_length: int = Field(default=512, ge=1)
    """Token budget of one episode's response, shared by all turns (tool tokens included)."""
    truncation: Literal["error", "left", "right", "middle"] = "error"
    """Over-long prompts: ``error`` names the row; ``left`` keeps the end; ``right`` keeps the start;
    ``middle`` keeps both ends."""
    filter_overlong_prompts: bool = False
    """Drop (and count) over-long prompts instead of applying ``truncation``."""
    return_raw_chat: bool = True
    """Rows keep raw chat messages; the agent loop applies the chat template (always true here)."""
    shuffle: bool = True
    """Shuffle training prompts each epoch."""

    @field_validator("return_raw_chat")
    @classmethod
    def _raw_chat(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "data.return_raw_chat=false is not supported: agent loops render the chat template themselves"
            )
        return value

    @property
    def train_paths(self) -> list[str]:
        return [self.train_files] if isinstance(self.train_files, str) else list(self.train_files)

    @property
    def val_paths(self) -> list[str]:
        if self.val_files is None:
            return []
        return [self.val_files] if isinstance(self.val_files, str) else list(self.val_files)


class Placement(Section):
    """Where a role's actors may run: Ray resources and node labels they require (both empty = anywhere)."""

    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each actor of the role reserves, e.g. ``{rollout_node: 1}``: only nodes started with
    that resource (``ray start --resources``, a KubeRay worker group's ``rayStartParams.resources``) take it.
    CPU and GPU are set by the role's own keys, not here."""
    label_selector: dict[str, str] = Field(default_factory=dict)
    """Ray node labels the role must run on, e.g. ``{ray.io/accelerator-type: H100}`` or ``{tandem/role: rollout}``
    (``ray start --labels``; KubeRay copies pod labels)."""

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources.{name}: set CPUs and GPUs with the role's own keys "
                                 "(serve.num_cpus_per_replica, trainer.n_gpus_per_node, ...); here only custom resources")
            if amount <= 0:
                raise ValueError(f"resources.{name}={amount}: must be > 0")
        return value

    def actor_options(self) -> dict[str, Any]:
        """The Ray actor options (``resources``, ``label_selector``) this placement adds; empty when unset."""
        return {**({"resources": dict(self.resources)} if self.resources else {}),
                **({"label_selector": dict(self.label_selector)} if self.label_selector else {})}


class TrainerConfig(Section):
    """verl's ``trainer``: run names and loggers, GPUs and nodes, steps, checkpoints and resume, validation, seed."""

    VERL_UNIMPLEMENTED: ClassVar[frozenset[str]] = frozenset(
        {"checkpoint_callback_class", "default_hdfs_dir", "use_v1", "v1", "critic_warmup", "balance_batch",
         "ray_wait_register_center_timeout", "profile_steps", "esi_redundant_time", "del_local_ckpt_after_load",
         "max_critic_ckpt_to_keep", "use_legacy_worker_impl", "npu_profile", "controller_nsight_options",
         "worker_nsight_options", "profile_continuous_steps", "generations_to_dump",
         "log_freq", "use_prefix_grouper"}
    )

    project_name: str = "tandem-rl"
    """Experiment name in mlflow (and wandb)."""
    experiment_name: str = "run"
    """Run name; checkpoints and outputs live under ``default_local_dir``."""
    logger: list[Literal["console", "mlflow", "wandb", "tensorboard", "file"]] = ["console", "mlflow"]
    """Metric sinks: ``console`` (progress bar, validation lines, end-of-run table), ``mlflow``
    (``tracking.mlflow_tracking_uri``), ``wandb`` (degrades to a warning when the package or network is missing),
    ``tensorboard`` (event files in ``$TENSORBOARD_DIR``, as verl, else ``<run dir>/tensorboard``), ``file``
    (``metrics.jsonl`` in the run dir, which every run writes)."""
    n_gpus_per_node: int = Field(default=1, ge=1, le=64)
    """Training workers per node (GPUs; CPU processes on a CPU machine)."""
    nnodes: int = Field(default=1, ge=1)
    """Nodes for training workers."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Training device (``auto``: CUDA when present)."""
    total_epochs: int = Field(default=1, ge=1)
    """Passes over the training prompts."""
    total_training_steps: int | None = Field(default=None, ge=1)
    """Stop after this many steps (default: epochs × prompts / train_batch_size)."""
    save_freq: int = -1
    """Checkpoint every N steps (-1 = only at the end)."""
    test_freq: int = -1
    """Validate every N steps and after the last one (-1 = never), with the adapter of that step; the learner
    waits while validation runs (as verl's trainer does), so every validation episode samples that adapter."""
    val_before_train: bool = False
    """Validate once before the first step (step 0: the base model, or ``model.lora_adapter_path``)."""
    val_only: bool = False
    """Validate once, write the metrics, and exit without training."""
    log_val_generations: int = Field(default=0, ge=0)
    """Show this many validation samples (input, output, score) per validation: console and an mlflow table."""
    validation_data_dir: str | None = None
    """Write every validation's samples to ``<dir>/<step>.jsonl`` (verl's dump: input, output, gts, score,
    step and the reward's extra keys)."""
    rollout_data_dir: str | None = None
    """Write every training step's batch to ``<dir>/<step>.jsonl`` (same format as ``validation_data_dir``)."""
    default_local_dir: str | None = None
    """Run outputs (default ``runs/<experiment_name>``), on the driver's node."""
    storage_path: str | None = None
    """Where Ray Train keeps checkpoints (``RunConfig.storage_path``): default ``<run dir>/ray_train``, a folder on
    this node, which is right on one node. On a cluster of several nodes the train workers may run elsewhere: give
    a URI every node reaches (``s3://…``, ``gs://…``, ``file:///mnt/nfs/…`` on shared storage); a node-local
    path is refused before training starts."""
    placement: Placement = Field(default_factory=Placement)
    """Where Ray Train workers run (passed to ``ScalingConfig``: ``resources_per_worker``, ``label_selector``)."""
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    """``auto`` resumes a run with the same name and storage path."""
    resume_from_path: str | None = None
    """Checkpoint folder for ``resume_mode=resume_path``."""
    max_actor_ckpt_to_keep: int | None = Field(default=2, ge=1)
    """Checkpoints kept on disk."""
    max_failures: int = Field(default=0, ge=-1)
    """Ray Train ``FailureConfig.max_failures`` (-1 = retry forever). A restarted learner restores the newest
    checkpoint (``save_freq``) and publishes it as the next policy version (versions never go back)."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """A step whose gradient norm is not finite skips the optimizer update (counted in ``train/skipped_steps``,
    warned); this many in a row stop the run with an error."""
    seed: int = 1
    """Global seed (data order, sampling seeds, LoRA init)."""

    @property
    def run_dir(self) -> str:
        return self.default_local_dir or f"runs/{self.experiment_name}"


class ServeConfig(Section):
    """``serve``: the rollout app on Ray Serve — name, route and address, replicas and autoscaling, resources,
    placement."""

    app_name: str = "tandem-rollout"
    """Serve application name; ``apps.train`` attaches to it if already deployed."""
    route_prefix: str = "/"
    """HTTP route of the OpenAI-compatible ingress."""
    host: str = "127.0.0.1"
    """HTTP bind address of Serve's proxy."""
    port: int = Field(default=8000, ge=1, le=65535)
    """HTTP port of Serve's proxy."""
    min_replicas: int = Field(default=1, ge=0)
    """Autoscaling floor of rollout replicas."""
    max_replicas: int = Field(default=1, ge=1)
    """Autoscaling ceiling of rollout replicas."""
    target_ongoing_requests: float = Field(default=16.0, gt=0)
    """Serve autoscaling target per replica."""
    max_ongoing_requests: int = Field(default=64, ge=1)
    """Requests a replica accepts at once."""
    num_cpus_per_replica: float = Field(default=1.0, gt=0)
    """CPUs reserved per rollout replica (fractional allowed)."""
    num_gpus_per_replica: float = Field(default=0.0, ge=0)
    """GPUs per rollout replica (vLLM)."""
    placement: Placement = Field(default_factory=Placement)
    """Where rollout replicas run (Serve's ``ray_actor_options``: ``resources``, ``label_selector``)."""
    api_key_env: str | None = None
    """Environment variable holding a bearer token the OpenAI ingress requires on every route (unset = open; named
    but unset or empty is an error)."""
    allow_public_without_key: bool = False
    """Serve on a non-loopback ``host`` without ``api_key_env``: anyone who reaches the port can then generate and
    read session records. Refused unless true."""
    upscale_delay_s: float = Field(default=5.0, ge=0)
    """Serve autoscaling upscale delay."""
    downscale_delay_s: float = Field(default=60.0, ge=0)
    """Serve autoscaling downscale delay."""

    @model_validator(mode="after")
    def _public_host_needs_a_key(self) -> ServeConfig:
        if not is_loopback(self.host) and not self.api_key_env and not self.allow_public_without_key:
            raise ValueError(
                f"serve.host={self.host} binds the OpenAI ingress beyond this machine, and serve.api_key_env is unset: "
                "anyone who reaches the port could generate with the policy and read session records. Set "
                "serve.api_key_env=<VAR> (the ingress then requires 'Authorization: Bearer $VAR'), bind "
                "serve.host=127.0.0.1, or opt out with serve.allow_public_without_key=true")
        return self


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, ``localhost``); wildcards and names are not."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class AgentLightningConfig(Section):
    """Agent Lightning agents as the trajectory source (the ``agent_lightning`` loop). 1.x: tandem-rl drives an
    ``agl-server`` over HTTP, which runs the user's unchanged agent through ``agl-controller`` (``server_url``,
    ``agent_class``). 0.3.x: the runners of an ``agl.Trainer`` whose algorithm is ``tandem_rl_agl.TandemRL`` run the
    agent, and tandem-rl enqueues rollouts in the trainer's store (``store_url``, which ``TandemRL`` sets)."""

    store_url: str | None = None
    """An Agent Lightning 0.3.x ``LightningStoreServer`` (e.g. ``http://localhost:4747``); ``TandemRL`` passes its
    trainer's. Exclusive with ``server_url``; only ``input_fields``, ``timeout_s``, ``wait_margin_s`` and
    ``missing_reward`` apply to it."""

    server_url: str | None = None
    """``agl-server``'s URL (e.g. ``http://127.0.0.1:8181``); required by rows whose agent is ``agent_lightning``."""
    api_key_env: str | None = None
    """Environment variable holding the server's ``key`` (sent as a bearer token); unset = the server has none."""
    model_name: str = "tandem"
    """The model name the rollout app is registered under: must equal the server's ``default_proxy.model_name``
    (its proxy answers 503 "No servers available" otherwise)."""
    agent_class: str | None = None
    """The agent ``agl-controller`` runs per rollout (``package.module.Class`` or ``package.module:Class``)."""
    env_map: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the agent process, each from the rollout input (``input.question``) or literal."""
    input_fields: dict[str, str] = Field(default_factory=dict)
    """Fields added to a rollout's ``input``, each a path into the row: ``messages.-1.content``, ``ground_truth``,
    ``data_source``, ``extra_info.<key>``. The input always carries ``data_id``, ``messages``, ``ground_truth``,
    ``data_source`` and the row's ``extra_info`` keys."""
    timeout_s: float = Field(default=600.0, gt=0)
    """The rollout's ``timeout_seconds``: the controller kills the agent after it; tandem-rl waits this plus
    ``wait_margin_s`` for a terminal state, then deletes the rollout and counts the group failed."""
    wait_margin_s: float = Field(default=60.0, ge=0)
    """Extra seconds to wait beyond ``timeout_s`` (the controller polls every ``local_runner.poll_interval`` s)."""
    poll_interval_s: float = Field(default=0.5, gt=0)
    """How often a rollout's state is read."""
    missing_reward: Literal["zero", "error"] = "zero"
    """A rollout that succeeded without a reward event: ``zero`` scores it 0 (as Agent Lightning's VERL trainer
    does with ``reward_fillna_value``) and counts it in ``agl_missing_reward``; ``error`` fails its group."""
    keep_rollouts: bool = False
    """Leave finished rollouts on the server (its store is in memory: by default each is deleted once read)."""


class StreamConfig(Section):
    """``stream``: streaming RL — the staleness bound, the trajectory queue, partial rollouts, the failure limit."""

    enabled: bool = True
    """Train on groups as they complete while generation goes on (False = batch-synchronous baseline)."""
    max_staleness: int = Field(default=1, ge=0, le=64)
    """How many policy versions generation may run ahead of the learner (0 = on-policy), applied when a group
    is admitted (AReaL's rule): at version ``v`` at most ``(v + max_staleness + 1) × train_batch_size`` groups
    have been started. An admitted group always finishes and is trained (see ``abort_stale``)."""
    abort_stale: bool = False
    """The older behaviour, for comparison: a publish aborts in-flight groups that started more than
    ``max_staleness`` versions ago, and queued groups that became too stale are dropped (both counted, with
    the dropped groups' lengths). It biases training toward short episodes; the default never abandons."""
    buffer_groups: int | None = Field(default=None, ge=1)
    """Capacity of the trajectory queue in groups (default ``(max_staleness + 1) × train_batch_size``); a
    finished group waits for room (back-pressure) instead of being dropped."""
    max_failed_groups: int | None = Field(default=None, ge=1)
    """Groups failing in a row (no group finished in between) before the run stops with the last failing row
    and its exception, instead of retrying forever (default ``max(8, 4 × train_batch_size)``)."""
    partial_rollout: bool = True
    """Weight syncs interrupt running generations instead of waiting for them (streaming, ``hf`` engine):
    the rows continue with the new adapter after their KV cache is recomputed, so one long episode never
    stalls a sync (AReaL's interruptible rollouts, verl's ``partial_rollout``). A trajectory's
    ``policy_version`` is then the oldest adapter that sampled any of its tokens."""


class ToolsConfig(Section):
    """``tools``: the tool config file, tool calls in flight per agent worker, and extra arguments for every tool."""

    config_path: str | None = None
    """Tool config YAML; used when ``multi_turn.tool_config_path`` is unset."""
    max_concurrency: int = Field(default=32, ge=1)
    """Tool calls in flight per agent worker."""
    env: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments every tool receives in its config."""


class TrackingConfig(Section):
    """``tracking``: where metrics and traces go (the mlflow store, Ray dashboard metrics)."""

    mlflow_tracking_uri: str = "sqlite:///mlruns.db"
    """mlflow store for params, metrics and traces."""
    ray_metrics: bool = True
    """Export buffer/staleness/tool metrics to the Ray dashboard."""
    ray_dashboard: bool = True
    """Start the Ray dashboard (:8265) with a local cluster: its metrics view and the State API Ray Train
    polls need it. ``false`` saves ~1 GB of memory and a second of start-up. Ignored with ``RAY_ADDRESS``."""


class SFTConfig(Section):
    """``sft``: the optional supervised cold start before GRPO — transcripts, base model, output folder, schedule."""

    enabled: bool = False
    """Run a supervised cold start before GRPO (cached under ``output_dir``)."""
    base_model: str | None = None
    """The model the cold start fine-tunes (default: ``actor_rollout_ref.model.path``); GRPO then starts from
    ``output_dir`` when ``model.path`` points there."""
    train_files: str | list[str] | None = None
    """Chat transcripts (jsonl with ``messages`` and optional ``tools``)."""
    output_dir: str = ".cache/sft-model"
    """Where the SFT model is written; GRPO then starts from it."""
    epochs: int = Field(default=1, ge=1)
    """Passes over the transcripts."""
    lr: float = Field(default=1e-3, gt=0, le=1)
    """Learning rate."""
    batch_size: int = Field(default=8, ge=1)
    """Transcripts per optimizer step."""
    max_length: int = Field(default=512, ge=16)
    """Longest transcript in tokens (longer ones are dropped and counted)."""
    full_finetune: bool = True
    """Train all weights (True) or a LoRA adapter merged at the end (False)."""


class CustomRewardFunctionConfig(Section):
    """verl's ``custom_reward_function``: a user's reward function that scores every row instead of the built-in
    rewards."""

    path: str | None = None
    """A Python file with the reward function (verl's ``custom_reward_function.path``). When set, it scores every
    row instead of the built-in reward chosen by ``data_source``."""
    name: str = "compute_score"
    """The function's name in that file, called as verl calls it: ``name(data_source=…, solution_str=…,
    ground_truth=…, extra_info=…, **reward_kwargs)``, returning a float or verl's dict (``{"score": …, "acc": …}``);
    a coroutine function is awaited."""
    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for every call (verl's ``custom_reward_function.reward_kwargs``)."""


class RewardModelConfig(Section):
    """verl's legacy ``reward_model`` section: only ``reward_kwargs`` is used here (no learned reward model)."""

    VERL_OTHER_KEYS_UNIMPLEMENTED: ClassVar[bool] = True

    reward_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the custom reward function (merged under its own ``reward_kwargs``)."""


class RewardConfig(Section):
    """verl 0.9's ``reward`` section: only ``custom_reward_function`` is used here."""

    VERL_OTHER_KEYS_UNIMPLEMENTED: ClassVar[bool] = True

    custom_reward_function: CustomRewardFunctionConfig = Field(default_factory=CustomRewardFunctionConfig)
    """Where verl 0.9 puts the custom reward function; the top-level ``custom_reward_function`` wins when both
    name a path."""
