"""Pieces of the training driver that wire deployments to trainers (apps layer).

``apps/train.py`` reads top to bottom as the data flow; what it needs beyond one line lives here:
connecting to Ray, loading and checking the training rows, the bridge that carries each published
adapter to the rollout replicas and the buffer, and the end-of-run summary.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import ray

from agents.data.rows import load_rows, row_dicts
from agents.data.truncation import PromptTooLongError
from agents.records import AdapterRef
from configs import TandemConfig

log = logging.getLogger("tandem_rl.driver")


def connect_ray(cfg: TandemConfig) -> None:
    """Join ``RAY_ADDRESS`` (a cluster, or ``ray job submit``) or start a local cluster."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
        return
    ray.init(include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})


def with_absolute_paths(cfg: TandemConfig) -> TandemConfig:
    """Ray workers run in other working directories: make every local path in the config absolute.

    Model paths become local folders (a hub id is fetched once here, on the driver).
    """
    from apps.model_paths import resolve_model_path

    model = cfg.actor_rollout_ref.model
    updates = [
        f"actor_rollout_ref.model.path={resolve_model_path(model.path)}",
        f"trainer.default_local_dir={Path(cfg.trainer.run_dir).resolve()}",
        f"sft.output_dir={Path(cfg.sft.output_dir).resolve()}",
    ]
    uri = cfg.tracking.mlflow_tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        updates.append(f"tracking.mlflow_tracking_uri=sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}")
    if model.tokenizer_path:
        updates.append(f"actor_rollout_ref.model.tokenizer_path={resolve_model_path(model.tokenizer_path)}")
    for key, value in (("actor_rollout_ref.rollout.multi_turn.tool_config_path",
                        cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path),
                       ("tools.config_path", cfg.tools.config_path)):
        if value:
            updates.append(f"{key}={Path(value).resolve()}")
    from configs import ConfigWarning, load_config

    with warnings.catch_warnings():  # already shown when the config was first loaded
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(cfg.model_dump(exclude_unset=True), updates)


def load_training_rows(cfg: TandemConfig, tokenizer: Any, tools_schemas: list[dict[str, Any]]) -> list[dict]:
    """Every training row, validated, with its rendered prompt checked against ``max_prompt_length``.

    ``truncation: error`` fails naming the file and row; ``filter_overlong_prompts`` drops (and logs)
    them; ``left``/``right``/``middle`` are applied by the agent loop on the prompt tokens.
    """
    rows: list[dict] = []
    dropped = 0
    limit = cfg.data.max_prompt_length
    for path in cfg.data.train_paths:
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
            rows.extend(row_dicts([row]))
    if dropped:
        log.warning("data.filter_overlong_prompts dropped %d rows longer than %d tokens", dropped, limit)
    if not rows:
        raise ValueError(f"no usable training rows in {cfg.data.train_paths}")
    return rows


class AdapterBridge:
    """The trainer's publisher: each new adapter goes to every rollout replica, then to the buffer.

    ``publish`` returns once all live replicas sample with the new version, so admission (which
    moves with the buffer's version) never starts a group on an adapter that is not loaded yet.
    Rank 0 also sends each step's metrics here (``record_metrics``) for the driver to log.
    """

    def __init__(self, app_name: str, buffer: Any, wait_s: float = 300.0):
        from apps.rollout import publish_adapter

        self._publish = publish_adapter
        self.app_name = app_name
        self.buffer = buffer
        self.wait_s = wait_s
        self.switches: list[dict[str, Any]] = []
        self.latest = AdapterRef(version=0)
        self._metrics: list[dict[str, float]] = []
        self._pending_switches: list[dict[str, Any]] = []

    def publish(self, ref: AdapterRef) -> dict[str, int]:
        started = time.perf_counter()
        loaded = self._publish(self.app_name, ref, self.wait_s)
        elapsed = time.perf_counter() - started
        for replica, version in sorted(loaded.items()):
            log.info("replica %s switched to policy version %d (%.2fs after publish)", replica, version, elapsed)
        self.switches.append({"version": ref.version, "replicas": loaded, "sync_s": elapsed})
        self._pending_switches.append(self.switches[-1])
        self.latest = ref
        ray.get(self.buffer.set_version.remote(ref.version))
        return loaded

    def record_metrics(self, metrics: dict[str, float]) -> None:
        self._metrics.append(dict(metrics))

    def take_metrics(self) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
        """Learner metrics and replica version switches since the last call."""
        out, self._metrics = self._metrics, []
        switches, self._pending_switches = self._pending_switches, []
        return out, switches

    def weight_sync(self) -> list[dict[str, Any]]:
        return list(self.switches)


AdapterBridgeActor = ray.remote(num_cpus=0)(AdapterBridge).options(max_concurrency=8)


def summary_table(history: list[dict[str, float]], paths: dict[str, Path], accounting: dict[str, float]) -> str:
    """The end-of-run table: reward per step, first vs last five steps, accounting, outputs."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="tandem-rl run summary")
    for col in ("step", "reward/mean", "response_length/mean", "tool_calls/mean", "staleness/mean", "step_s"):
        table.add_column(col, justify="right")
    for row in history:
        table.add_row(str(int(row["step"])), *(f"{row.get(k, float('nan')):.3f}" for k in (
            "reward/mean", "response_length/mean", "tool_calls/mean", "staleness/mean", "timing/step_s")))
    console = Console(record=True, width=110)
    console.print(table)
    rewards = [row.get("reward/mean", 0.0) for row in history]
    if len(rewards) >= 2:
        k = min(5, len(rewards) // 2)
        first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
        console.print(f"mean reward: first {k} steps {first:.3f} → last {k} steps {last:.3f} "
                      f"(Δ {last - first:+.3f})")
    console.print("groups: " + ", ".join(f"{k.split('/')[-1]}={int(v)}" for k, v in accounting.items()))
    for name, path in paths.items():
        console.print(f"{name:>14}: {path}")
    return console.export_text()  # already printed; returned for logs and tests
