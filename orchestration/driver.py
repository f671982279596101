"""Pieces of the training driver that wire deployments to trainers (orchestration layer).

The stages of ``orchestration.run.TrainingRun`` read top to bottom as the data flow; what they need beyond a line lives
here:
connecting to Ray, checking resources, loading and checking the training rows, and the end-of-run summary. The
publisher and the metrics sink are in ``orchestration/publishing.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

import ray

from agents.data.rows import DatasetRow, load_rows
from agents.data.truncation import PromptTooLongError
from orchestration.cluster import ClusterError
from configs import TandemConfig

log = logging.getLogger("tandem_rl.driver")


def connect_ray(cfg: TandemConfig) -> None:
    """Join ``RAY_ADDRESS`` (a cluster, or ``ray job submit``) or start a local cluster."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        if sum(1 for node in ray.nodes() if node["Alive"]) == 1:
            # One node has no other node to drain: Ray Train's preemption watcher only logs an error-level line at
            # start (Ray Train passes this variable on to its controller). A cluster of several nodes keeps it.
            os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        return
    # address="local": a new cluster of our own. Without it ray.init() attaches to whatever cluster Ray's
    # ray_current_cluster file names (another run's, or a dead one it then waits for).
    # Workers log at WARNING (their INFO lines stay in Ray's log files and the dashboard); download/loading
    # progress bars of every model load would otherwise fill the console.
    # Ray Train's preemption watcher polls for draining nodes (spot instances); a one-node local cluster has none,
    # and its actor's start logs an error-level line from Ray's core worker on every run.
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
           "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")  # the Ray Train controller may run here
    # Two runs started together on one machine would both find the dashboard's port free, and the second's dashboard
    # would then fail to bind it and take ray.init down: the port is chosen and bound under a machine-wide lock.
    with _machine_lock("ray-init"):
        dashboard = {"dashboard_port": _dashboard_port()} if cfg.tracking.ray_dashboard else {}
        ray.init(address="local", include_dashboard=cfg.tracking.ray_dashboard, log_to_driver=True,
                 logging_config=ray.LoggingConfig(log_level="WARNING"), runtime_env={"env_vars": env}, **dashboard)


@contextlib.contextmanager
def _machine_lock(name: str) -> Iterator[None]:
    """An exclusive lock shared by every process on this machine (a file lock in the temp folder)."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / f"tandem-rl-{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _dashboard_port(default: int = 8265) -> int:
    """Ray's dashboard port, or a free one when another cluster (a `ray start --head` one) holds it: the new
    cluster's dashboard would fail to bind it and take ``ray.init`` down with it."""
    import socket

    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", default)) != 0:
            return default
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    logging.getLogger("tandem_rl.driver").warning("port %d is taken (another Ray cluster's dashboard?): this run's "
                                                  "dashboard listens on %d", default, port)
    return port


class ResourceError(RuntimeError):
    """The run cannot be placed on the cluster (``check_resources``)."""


def cli(main: Any) -> int:
    """Run a command-line entry point: a mistake in the config, the data, a path or the resource plan prints one
    ``error: …`` line (the key, row or path, and the fix) and exits 2, without a traceback unless ``--debug`` or
    ``TANDEM_DEBUG=1``; config warnings print as ``warning: …`` (their message names the key), not as a library
    frame."""
    import sys

    from agents.data.rows import DataError
    from agents.data.truncation import PromptTooLongError
    from configs import ConfigError, ConfigWarning

    debug = "--debug" in sys.argv[1:] or os.environ.get("TANDEM_DEBUG") == "1"
    if "--debug" in sys.argv[1:]:
        sys.argv.remove("--debug")
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigWarning) and not debug:
            print(f"warning: {message}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)
    warnings.showwarning = show
    try:
        return main()
    except (ConfigError, DataError, PromptTooLongError, ResourceError, ClusterError, FileNotFoundError) as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


INGRESS_CPUS = 0.1  # the OpenAI ingress deployment's one replica (deployments/openai_ingress.py)


def resource_plan(cfg: TandemConfig, *, deploy_rollout: bool, learner: bool = True) -> dict[str, dict[str, float]]:
    """What the run will ask the cluster for, by part: rollout replicas at their autoscaling maximum
    (``serve.max_replicas``) and the ingress (when this run deploys the app), and the Ray Train workers, and
    the custom resources of the agent workers' placement. Nothing else (buffer, coordinator, registry) reserves."""
    serve_cfg, trainer = cfg.serve, cfg.trainer
    plan: dict[str, dict[str, float]] = {}
    if deploy_rollout:
        plan[f"rollout replicas (serve.max_replicas={serve_cfg.max_replicas} × serve.num_cpus_per_replica="
             f"{serve_cfg.num_cpus_per_replica:g}, num_gpus_per_replica={serve_cfg.num_gpus_per_replica:g})"] = {
            "CPU": serve_cfg.max_replicas * serve_cfg.num_cpus_per_replica,
            "GPU": serve_cfg.max_replicas * serve_cfg.num_gpus_per_replica,
            **{name: serve_cfg.max_replicas * amount for name, amount in serve_cfg.placement.resources.items()}}
        plan["OpenAI ingress (1 replica)"] = {"CPU": INGRESS_CPUS, "GPU": 0.0}
    if not learner:  # trainer.val_only
        return plan
    from trainers.trainer import use_gpu

    workers = trainer.n_gpus_per_node * trainer.nnodes
    gpu = use_gpu(trainer.device)
    plan[f"Ray Train workers (trainer.n_gpus_per_node={trainer.n_gpus_per_node} × trainer.nnodes={trainer.nnodes})"] = {
        "CPU": float(workers), "GPU": float(workers) if gpu else 0.0,
        **{name: workers * amount for name, amount in trainer.placement.resources.items()}}
    agent = cfg.actor_rollout_ref.rollout.agent
    if agent.placement.resources:
        plan[f"agent workers (actor_rollout_ref.rollout.agent.num_workers={agent.num_workers})"] = {
            name: agent.num_workers * amount for name, amount in agent.placement.resources.items()}
    return plan


def check_resources(cfg: TandemConfig, *, deploy_rollout: bool, learner: bool = True) -> None:
    """Fail in seconds, before anything is deployed, when the run cannot be placed: otherwise the learner's
    worker group waits for resources for minutes. Against the cluster's total when this run deploys the rollout
    app, against what is free when it attaches to one already running."""
    plan = resource_plan(cfg, deploy_rollout=deploy_rollout, learner=learner)
    have = ray.cluster_resources() if deploy_rollout else ray.available_resources()
    short = []
    kinds = dict.fromkeys(kind for part in plan.values() for kind in part)  # CPU, GPU, then custom resources
    for kind in kinds:
        asked = sum(part.get(kind, 0.0) for part in plan.values())
        if asked > have.get(kind, 0.0) + 1e-9:
            short.append(f"{asked:g} {kind}s asked, the cluster has {have.get(kind, 0.0):g}"
                         + ("" if deploy_rollout else " free"))
    if short:
        lines = "\n".join(f"  {name}: " + ", ".join(f"{v:g} {k}" for k, v in need.items() if v)
                          for name, need in plan.items())
        raise ResourceError(
            f"the run does not fit the cluster: {'; '.join(short)}. Demand by part:\n{lines}\n"
            "Lower serve.max_replicas or serve.num_cpus_per_replica (rollout), or trainer.n_gpus_per_node "
            "(learner workers), or add nodes (with the custom resources the roles' placement keys ask for).")


# Why a relative path can be missing under ``ray job submit``: said in the error, where it is needed.
JOB_ROOT_HINT = ("`ray job submit --working-dir .` runs the job in an uploaded copy of the repo without its "
                 "git-ignored folders (.cache/, runs/): pass --root with the directory that has them")


def with_absolute_paths(cfg: TandemConfig, root: Path | None = None) -> TandemConfig:
    """Ray workers run in other working directories: make every local path in the config absolute.

    Relative paths resolve against ``root``, by default the working directory; an input that ``root``
    lacks but the working directory has (a tool config shipped in the repo) is taken from there. Model
    paths become local folders (a hub id is fetched once here, on the driver).
    """
    from deployments.model_paths import resolve_model_path
    from trainers.storage import is_uri

    hint = f"; {JOB_ROOT_HINT}" if root is None else ""
    root = (root or Path.cwd()).resolve()

    def local(path: str) -> Path:  # outputs, and inputs found under root
        return (root / Path(path).expanduser()).resolve()  # an absolute path stays itself

    def source(path: str) -> Path:
        here = Path.cwd() / Path(path).expanduser()
        return here.resolve() if not local(path).exists() and here.exists() else local(path)

    def model_folder(key: str, path: str) -> str:
        folder = source(path)
        try:  # no such folder: a hub id
            return resolve_model_path(folder if folder.exists() else path)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{key}: {exc} (relative paths resolve against {root}{hint})") from None

    def files(value: str | list[str]) -> str:
        return str(source(value)) if isinstance(value, str) else json.dumps([str(source(v)) for v in value])

    model, data = cfg.actor_rollout_ref.model, cfg.data
    updates = [
        f"actor_rollout_ref.model.path={model_folder('actor_rollout_ref.model.path', model.path)}",
        f"data.train_files={files(data.train_files)}",
        f"trainer.default_local_dir={local(cfg.trainer.run_dir)}",
        f"sft.output_dir={local(cfg.sft.output_dir)}",
    ]
    if data.val_files is not None:
        updates.append(f"data.val_files={files(data.val_files)}")
    uri = cfg.tracking.mlflow_tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        updates.append(f"tracking.mlflow_tracking_uri=sqlite:///{local(uri[len('sqlite:///'):])}")
    if model.tokenizer_path:
        updates.append("actor_rollout_ref.model.tokenizer_path="
                       + model_folder("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path))
    for key, value in (("actor_rollout_ref.rollout.multi_turn.tool_config_path",
                        cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path),
                       ("tools.config_path", cfg.tools.config_path),
                       ("custom_reward_function.path", cfg.custom_reward_function.path),
                       ("reward.custom_reward_function.path", cfg.reward.custom_reward_function.path),
                       ("actor_rollout_ref.model.lora_adapter_path", model.lora_adapter_path),
                       ("trainer.resume_from_path", cfg.trainer.resume_from_path)):
        if value:
            updates.append(f"{key}={source(value)}")
    trainer = cfg.trainer
    local_storage = trainer.storage_path if trainer.storage_path and not is_uri(trainer.storage_path) else None
    for key, value in (("trainer.storage_path", local_storage),
                       ("trainer.validation_data_dir", trainer.validation_data_dir),
                       ("trainer.rollout_data_dir", trainer.rollout_data_dir)):
        if value:
            updates.append(f"{key}={local(value)}")
    from configs import ConfigWarning, load_config

    with warnings.catch_warnings():  # already shown when the config was first loaded
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(cfg.model_dump(exclude_unset=True), updates)


def load_training_rows(cfg: TandemConfig, tokenizer: Any, tools_schemas: list[dict[str, Any]],
                       paths: list[str] | None = None) -> list[DatasetRow]:
    """Every row of ``paths`` (default: the training files), validated, with its rendered prompt checked against
    ``max_prompt_length``.

    ``truncation: error`` fails naming the file and row; ``filter_overlong_prompts`` drops (and logs)
    them; ``left``/``right``/``middle`` are applied by the agent loop on the prompt tokens.
    """
    rows: list[DatasetRow] = []  # typed from here to the agent worker
    dropped = 0
    limit = cfg.data.max_prompt_length
    paths = cfg.data.train_paths if paths is None else paths
    for path in paths:
        for number, row in enumerate(load_rows(path)):
            messages = [m.model_dump(exclude_none=True) for m in row.prompt]
            ids = tokenizer.apply_chat_template(messages, tools=tools_schemas or None, add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            if len(ids) > limit:
                if cfg.data.filter_overlong_prompts:
                    dropped += 1
                    continue
                if cfg.data.truncation == "error":
                    raise PromptTooLongError(
                        f"{path} row {number}: prompt has {len(ids)} tokens, max_prompt_length is {limit}"
                    )
            rows.append(row)
    if dropped:
        log.warning("data.filter_overlong_prompts dropped %d rows longer than %d tokens", dropped, limit)
    if not rows:
        raise ValueError(f"no usable rows in {paths}")
    return rows


def merge_sources(**sources: dict[str, float]) -> dict[str, float]:
    """One metrics row from several sources; a key two sources both report must agree (else it names both)."""
    out: dict[str, float] = {}
    owner: dict[str, str] = {}
    for name, metrics in sources.items():
        for key, value in metrics.items():
            if key in out and out[key] != value and not (value != value and out[key] != out[key]):  # NaN == NaN
                raise ValueError(f"metric {key!r}: {owner[key]} says {out[key]}, {name} says {value}")
            out[key], owner[key] = value, owner.get(key, name)
    return out


def final_adapter(run_dir: Path) -> Path | None:
    """The newest ``adapters/v<k>`` folder of a run, if any."""
    adapters = sorted((run_dir / "adapters").glob("v*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1)
    return adapters[-1] if adapters else None


def summary_table(history: list[dict[str, float]], paths: dict[str, Path], accounting: dict[str, float]) -> str:
    """The end-of-run table: per step training reward, ``reward/acc``, tool calls, length, staleness, time; first vs
    last five steps; held-out validation (each data source's ``val-core`` metric) at every validation; outputs."""
    from rich.console import Console
    from rich.table import Table

    cols = ("reward/mean", "reward/acc", "tool_calls/mean", "response_length/mean", "staleness/mean", "timing/step_s")
    train = [row for row in history if "reward/mean" in row]
    table = Table(title="tandem-rl run summary")
    for col in ("step", *cols):
        table.add_column(col.removesuffix("/mean") if col != "reward/mean" else col, justify="right")
    for row in train:
        table.add_row(str(int(row["step"])), *(f"{row.get(k, float('nan')):.3f}" for k in cols))
    console = Console(record=True, width=110)
    if train:
        console.print(table)
    for key in ("reward/mean", "reward/acc", "tool_calls/mean"):
        values = [row[key] for row in train if key in row]
        if len(values) >= 2:
            k = min(5, len(values) // 2)
            first, last = sum(values[:k]) / k, sum(values[-k:]) / k
            console.print(f"train {key}: first {k} steps {first:.3f} → last {k} steps {last:.3f} (Δ {last - first:+.3f})")
    _validation_lines(console, history)
    if accounting:
        console.print("groups: " + ", ".join(f"{k.split('/')[-1]}={int(v)}" for k, v in accounting.items()))
    for name, path in paths.items():
        console.print(f"{name:>14}: {path}")
    return console.export_text()  # already printed; returned for logs and tests


def _validation_lines(console: Any, history: list[dict[str, float]]) -> None:
    """Each data source's held-out ``val-core/<source>/<acc|reward>/mean@N`` at every validation, first → last."""
    rows = [row for row in history if any(k.startswith("val-core/") for k in row)]
    keys = sorted({k for row in rows for k in row if k.startswith("val-core/") and "/mean@" in k})
    for key in keys:
        points = [(int(row["step"]), row[key]) for row in rows if key in row]
        trail = ", ".join(f"step {step}: {value:.3f}" for step, value in points)
        delta = f" (Δ {points[-1][1] - points[0][1]:+.3f})" if len(points) >= 2 else ""
        console.print(f"held-out {key}: {trail}{delta}")
