"""The rollout Serve application: builder for ``serve_config.yaml`` and deploy helper (deployments layer: composes the replicas, router and ingress into one app).

``serve deploy serve_config.yaml`` imports ``apps.rollout:build_app`` (a re-export of ``build_app`` here) and calls it with the file's
``args`` (validated by ``RolloutAppArgs``); the training driver calls ``deploy_rollout_app(cfg)``, which
builds the same app from a ``TandemConfig``. The app has two deployments:

- ``RolloutServer`` (``deployments.rollout_server.RolloutReplica``): the engine replicas, autoscaled,
  routed by ``deployments.router.StickyRouter``, each following the app's ``AdapterRegistry``;
- ``OpenAIIngress``: the OpenAI-compatible HTTP endpoint, one replica, calling ``RolloutServer``.

Deployment options in a Serve config file (``deployments: [{name: RolloutServer, ...}]``) override the
ones set here, so ``serve_config.yaml`` can tune autoscaling without touching the args.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
import ray
from ray import serve
from ray.serve import Application
from ray.serve.config import DEFAULT_METRICS_INTERVAL_S, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from agents.parsers import ParserFormat
from agents.records import AdapterRef
from deployments.model_paths import resolve_model_path
from configs import TandemConfig
from configs.sections import Placement
from deployments.access import token_from_env
from deployments.adapter_registry import drop_adapter_registry, get_adapter_registry
from deployments.adapter_registry import publish_adapter as _publish_adapter
from deployments.engines import hf_engine_options
from deployments.openai_ingress import OpenAIIngress
from deployments.rollout_server import EngineSpec, RolloutReplica
from deployments.router import StickyRouter

REPO_ROOT = Path(__file__).resolve().parents[1]
ROLLOUT_DEPLOYMENT = "RolloutServer"
INGRESS_DEPLOYMENT = "OpenAIIngress"


class RolloutAppArgs(BaseModel):
    """Builder args of the rollout app (the ``args:`` block of an application in ``serve_config.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = ".cache/tiny-model"
    """Local model folder (relative paths: the working directory, then the repo root) or hub id."""
    served_model_name: str | None = None
    """Model name shown by ``/v1/models`` (default: the folder name)."""
    engine: Literal["hf", "vllm"] = "hf"
    """``hf`` (transformers, CPU) or ``vllm`` (GPU)."""
    parser: ParserFormat = "qwen25_coder"
    """Tool-call format the OpenAI endpoint parses into ``tool_calls``."""
    max_model_len: int = Field(default=4096, ge=16)
    """Context length; longer prompts are rejected, never truncated."""
    min_replicas: int = Field(default=1, ge=0)
    """Autoscaling floor."""
    max_replicas: int = Field(default=1, ge=1)
    """Autoscaling ceiling."""
    target_ongoing_requests: float = Field(default=16.0, gt=0)
    """Autoscaling target of requests per replica."""
    max_ongoing_requests: int = Field(default=64, ge=1)
    """Requests one replica accepts at once."""
    upscale_delay_s: float = Field(default=5.0, ge=0)
    """Autoscaling upscale delay."""
    downscale_delay_s: float = Field(default=60.0, ge=0)
    """Autoscaling downscale delay."""
    metrics_interval_s: float = Field(default=DEFAULT_METRICS_INTERVAL_S, gt=0)
    """How often handles and replicas report their queue lengths to the autoscaler (Serve's default)."""
    look_back_period_s: float = Field(default=30.0, gt=0)
    """Window the autoscaler averages queue lengths over; must exceed ``metrics_interval_s``."""
    num_cpus: float = Field(default=1.0, gt=0)
    """CPUs reserved per replica (fractional allowed)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs per replica (vLLM)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources per replica: places replicas on the nodes that have them."""
    label_selector: dict[str, str] = Field(default_factory=dict)
    """Ray node labels replicas must run on."""
    api_key_env: str | None = None
    """Environment variable with the bearer token the OpenAI endpoint requires (unset = open)."""
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to the engine's constructor (``HFEngine`` / ``VLLMEngine``)."""
    ingress_replicas: int = Field(default=1, ge=1)
    """Replicas of the OpenAI ingress (HTTP only: they share one session store, so any replica reads any session)."""

    @model_validator(mode="after")
    def _replica_bounds(self) -> RolloutAppArgs:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} > max_replicas={self.max_replicas}")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"look_back_period_s={self.look_back_period_s} must exceed metrics_interval_s={self.metrics_interval_s}"
            )
        if "max_model_len" in self.engine_kwargs:
            raise ValueError("engine_kwargs.max_model_len: set the builder arg max_model_len instead")
        return self


def _local_model(path: str) -> str:
    # ``serve deploy`` builds the app in a cluster process whose working directory is not the repo.
    candidate = Path(path).expanduser()
    if not candidate.is_absolute() and not candidate.exists() and (REPO_ROOT / candidate).exists():
        candidate = REPO_ROOT / candidate
    return resolve_model_path(candidate if candidate.exists() else path)


def _metrics_interval(seconds: float) -> dict[str, float]:
    # Serve marks the field deprecated (and warns) but its handles still push on this period in 2.60:
    # pass it only when it differs from Serve's default.
    return {} if seconds == DEFAULT_METRICS_INTERVAL_S else {"metrics_interval_s": seconds}


def build_app(args: dict[str, Any] | RolloutAppArgs) -> Application:
    """The rollout app: ``OpenAIIngress`` (HTTP ingress) bound to autoscaled ``RolloutServer`` replicas."""
    spec_args = args if isinstance(args, RolloutAppArgs) else RolloutAppArgs.model_validate(args)
    # Read here and passed as an argument, so ingress replicas on any node have it (deployments.access)
    token = token_from_env(spec_args.api_key_env, "api_key_env (serve.api_key_env in a training config)")
    if spec_args.engine == "hf":  # here, not as a TypeError in every replica that starts
        unknown = sorted(set(spec_args.engine_kwargs) - hf_engine_options())
        if unknown:
            raise ValueError(f"engine_kwargs {unknown}: not options of the hf engine (HFEngine), which takes "
                             f"{sorted(hf_engine_options())}")
    model_path = _local_model(spec_args.model)
    engine_kwargs = dict(spec_args.engine_kwargs)
    if spec_args.engine == "hf":
        # One torch thread per reserved CPU: replicas sharing a small box must not oversubscribe it.
        engine_kwargs.setdefault("num_threads", max(1, int(spec_args.num_cpus)))
    spec = EngineSpec(spec_args.engine, model_path, spec_args.max_model_len, engine_kwargs)
    rollout = serve.deployment(RolloutReplica).options(
        name=ROLLOUT_DEPLOYMENT,
        autoscaling_config={
            "min_replicas": spec_args.min_replicas,
            "max_replicas": spec_args.max_replicas,
            "target_ongoing_requests": spec_args.target_ongoing_requests,
            "upscale_delay_s": spec_args.upscale_delay_s,
            "downscale_delay_s": spec_args.downscale_delay_s,
            "look_back_period_s": spec_args.look_back_period_s,
            **_metrics_interval(spec_args.metrics_interval_s),
        },
        max_ongoing_requests=spec_args.max_ongoing_requests,
        ray_actor_options={"num_cpus": spec_args.num_cpus, "num_gpus": spec_args.num_gpus,
                           **Placement(resources=spec_args.resources,
                                       label_selector=spec_args.label_selector).actor_options()},
        # one access-log line per generate call flooded the driver's console (3,800 lines in a CPU demo);
        # the replica's metrics count the calls, and the ingress keeps its access log
        logging_config={"enable_access_log": False},
        request_router_config=RequestRouterConfig(
            request_router_class=StickyRouter, request_routing_stats_period_s=2.0
        ),
    )
    ingress_options: dict[str, Any] = {"num_cpus": 0.1}
    # Serve's default of 5 requests in flight per ingress replica would cap every HTTP client (an agent framework, a
    # load test) at 5 generations per ingress replica: it takes what every rollout replica together accepts
    ingress = OpenAIIngress.options(name=INGRESS_DEPLOYMENT, num_replicas=spec_args.ingress_replicas,
                                    ray_actor_options=ingress_options,
                                    max_ongoing_requests=spec_args.max_ongoing_requests * spec_args.max_replicas)
    return ingress.bind(
        rollout.bind(spec),
        model_path,
        spec_args.served_model_name or Path(model_path).name,
        spec_args.parser,
        spec_args.max_model_len,
        token,
        spec_args.engine,
    )


def _engine_kwargs(cfg: TandemConfig) -> dict[str, Any]:
    """``engine_kwargs.<engine>`` plus the rollout keys each engine takes under its own name."""
    rollout = cfg.actor_rollout_ref.rollout
    kwargs = {k: v for k, v in rollout.engine_kwargs.get(rollout.name, {}).items() if k != "max_model_len"}
    if rollout.dtype != "auto":
        kwargs.setdefault("dtype", rollout.dtype)
    if rollout.name == "hf":
        kwargs.setdefault("max_batch_size", rollout.max_num_seqs)
        # batch-synchronous runs sync weights with nothing in flight: draining costs them nothing
        kwargs.setdefault("swap", "interrupt" if cfg.stream.enabled and cfg.stream.partial_rollout else "drain")
        return kwargs
    defaults = {
        "max_num_seqs": rollout.max_num_seqs,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "tensor_parallel_size": rollout.tensor_model_parallel_size,
        "enforce_eager": rollout.enforce_eager,
        "max_lora_rank": max(cfg.actor_rollout_ref.model.lora_rank, 8),
    }
    return {**defaults, **kwargs}


def args_from_config(cfg: TandemConfig) -> RolloutAppArgs:
    """Builder args of the experiment's rollout app (``serve`` + ``actor_rollout_ref.rollout`` sections)."""
    serve_cfg, rollout = cfg.serve, cfg.actor_rollout_ref.rollout
    return RolloutAppArgs(
        model=cfg.actor_rollout_ref.model.path,
        engine=rollout.name,
        parser=rollout.multi_turn.format,
        max_model_len=cfg.max_model_len,
        min_replicas=serve_cfg.min_replicas,
        max_replicas=serve_cfg.max_replicas,
        target_ongoing_requests=serve_cfg.target_ongoing_requests,
        max_ongoing_requests=serve_cfg.max_ongoing_requests,
        upscale_delay_s=serve_cfg.upscale_delay_s,
        downscale_delay_s=serve_cfg.downscale_delay_s,
        num_cpus=serve_cfg.num_cpus_per_replica,
        num_gpus=serve_cfg.num_gpus_per_replica,
        resources=serve_cfg.placement.resources,
        label_selector=serve_cfg.placement.label_selector,
        api_key_env=serve_cfg.api_key_env,
        engine_kwargs=_engine_kwargs(cfg),
    )


def deploy_rollout_app(
    cfg: TandemConfig, *, blocking: bool = False, base: AdapterRef = AdapterRef(version=0), wait_s: float = 120.0
) -> DeploymentHandle:
    """Deploy (or update) the rollout app on the connected Ray cluster; returns the ``RolloutServer`` handle
    once every replica samples with ``base``, the run's policy version 0 (the base model, or with a path
    the saved adapter the run starts from).

    A new app starts at policy version 0: a registry left by an earlier app of that name (a run that
    died before ``delete_rollout_app``) is dropped first, and the new one starts at ``base``, so replicas
    load it before they serve. An app that was already running is reset to ``base``.
    """
    serve_cfg = cfg.serve
    # Serve's controller and proxy log deploys and health checks at INFO: kept in Ray's log files, not the console
    serve.start(http_options={"host": serve_cfg.host, "port": serve_cfg.port}, logging_config={"log_level": "WARNING"})
    registry = None
    if serve_cfg.app_name not in serve.status().applications:
        drop_adapter_registry(serve_cfg.app_name)
        if base.path:  # no replica yet: returns at once, and each replica loads ``base`` in its constructor
            registry = get_adapter_registry(serve_cfg.app_name)
            ray.get(registry.reset.remote(wait_s, base))
    serve.run(
        build_app(args_from_config(cfg)),
        name=serve_cfg.app_name,
        route_prefix=serve_cfg.route_prefix,
        blocking=blocking,
    )
    # every live replica on ``base`` (at once for replicas that loaded it starting; an updated app swaps)
    registry = registry or get_adapter_registry(serve_cfg.app_name)
    ray.get(registry.reset.remote(wait_s, base))
    return rollout_handle(serve_cfg.app_name)


def ingress_url(serve_cfg: Any) -> str:
    """The OpenAI ingress's base URL as agents on this cluster reach it (``http://host:port/prefix``; a wildcard
    bind address is reached on loopback)."""
    host = "127.0.0.1" if serve_cfg.host in ("0.0.0.0", "::", "") else serve_cfg.host
    host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    return f"http://{host}:{serve_cfg.port}{serve_cfg.route_prefix.rstrip('/')}"


def deployed_apps() -> set[str]:
    """Serve applications already running on the cluster (none when Serve is not started)."""
    try:
        return set(serve.status().applications)
    except Exception:  # Serve not started on this cluster yet
        return set()


def delete_rollout_app(app_name: str) -> None:
    """Delete the app and its adapter registry (the next app of that name starts at policy version 0)."""
    serve.delete(app_name)
    drop_adapter_registry(app_name)


def attach_rollout_app(
    app_name: str, wait_s: float = 120.0, base: AdapterRef = AdapterRef(version=0)
) -> DeploymentHandle:
    """The handle of an app deployed beforehand (``serve deploy``), every replica sampling with ``base``.

    Such an app outlives training runs: each run starts at policy version 0 (``AdapterRegistry.reset``):
    the base model, or with a path the saved adapter the run starts from; its first publish (version 1)
    is newer than what the previous run left. One run at a time.
    """
    ray.get(get_adapter_registry(app_name).reset.remote(wait_s, base))
    return rollout_handle(app_name)


def rollout_handle(app_name: str, *, deployed: bool = True) -> DeploymentHandle:
    """The ``RolloutServer`` handle of an app that is already running (``generate``, ``load_adapter``); with
    ``deployed=False`` of one being deployed: a handle only names its deployment and finds the replicas at its first
    call (Serve's lookup would refuse a deployment not registered yet)."""
    if not deployed:
        return DeploymentHandle(ROLLOUT_DEPLOYMENT, app_name)
    return serve.get_deployment_handle(ROLLOUT_DEPLOYMENT, app_name=app_name)


def ingress_handle(app_name: str) -> DeploymentHandle:
    """The ``OpenAIIngress`` handle (``pop_session``)."""
    return serve.get_deployment_handle(INGRESS_DEPLOYMENT, app_name=app_name)


def publish_adapter(app_name: str, ref: AdapterRef, wait_s: float = 120.0) -> dict[str, int]:
    """Make ``ref`` the policy of every replica of the app (current and future); returns versions by replica."""
    return _publish_adapter(app_name, ref, wait_s)
