"""Run outputs and observability at the edge (observability layer).

``RunTracker`` receives the per-step metrics dicts that core code returns and sends them to every
sink the config names: ``metrics.jsonl`` (always), an mlflow run (sqlite store by default), wandb
(degrades to a warning when missing or offline), the console, and Ray dashboard gauges. At the
end it draws ``reward_curve.png``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from configs import TandemConfig

log = logging.getLogger("tandem_rl.tracking")

# Metrics shown as Ray dashboard gauges (name in metrics dict → gauge name).
_RAY_GAUGES = {
    "buffer/depth": "tandem_buffer_depth",
    "staleness/mean": "tandem_staleness_mean",
    "rollout/episodes_per_s": "tandem_episodes_per_s",
    "tool_parse_errors/sum": "tandem_tool_parse_failures",
    "timing/step_s": "tandem_train_step_s",
    "reward/mean": "tandem_reward_mean",
    "policy_version": "tandem_policy_version",
}


# mlflow stores being opened in a thread (tracking URI → thread), waited for by RunTracker
_PREPARING: dict[str, threading.Thread] = {}


def prepare_store(cfg: TandemConfig) -> None:
    """Import mlflow and open its store (a new sqlite file: its tables are created) in a thread, so the ~6 s this
    takes on 2 cores overlaps Ray's start-up; ``RunTracker`` waits for it. Creates no experiment and no run: a run
    refused afterwards leaves at most an empty store."""
    uri = cfg.tracking.mlflow_tracking_uri
    if "mlflow" not in cfg.trainer.logger or not uri.startswith("sqlite:") or uri in _PREPARING:
        return

    def open_store() -> None:
        try:
            import mlflow

            mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:  # noqa: BLE001 - RunTracker opens the store again and raises what is wrong
            log.debug("mlflow store %s not prepared ahead: %s", uri, exc)

    thread = threading.Thread(target=open_store, name="mlflow-store", daemon=True)
    thread.start()
    _PREPARING[uri] = thread


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists stay values)."""
    if not isinstance(value, dict):
        return {prefix.rstrip("."): value}
    out: dict[str, Any] = {}
    for key, sub in value.items():
        out.update(flatten(sub, f"{prefix}{key}."))
    return out


class RunTracker:
    """Sends each step's metrics to every sink the config names (module docstring), then draws the reward curve."""

    def __init__(self, cfg: TandemConfig, run_dir: Path, *, ray_metrics: bool = True):
        self.cfg = cfg
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = run_dir / "metrics.jsonl"
        self.history: list[dict[str, float]] = []
        # Rows of an earlier run in this folder; those from the first step logged now onwards are
        # replaced (a resumed run keeps the steps before its checkpoint).
        self._earlier = [json.loads(line) for line in self.metrics_path.read_text().splitlines()] \
            if self.metrics_path.is_file() else []
        self.mlflow_run_id: str | None = None
        self._wandb = None
        self._tensorboard = None
        self._gauges: dict[str, Any] = {}
        loggers = set(cfg.trainer.logger)
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            folder = Path(os.environ.get("TENSORBOARD_DIR") or run_dir / "tensorboard")
            self._tensorboard = SummaryWriter(log_dir=str(folder))
        if "mlflow" in loggers:
            self._start_mlflow()
        if "wandb" in loggers:
            self._start_wandb()
        if ray_metrics and cfg.tracking.ray_metrics:
            self._start_ray_gauges()

    def _start_mlflow(self) -> None:
        preparing = _PREPARING.pop(self.cfg.tracking.mlflow_tracking_uri, None)
        if preparing is not None:
            preparing.join()
        import mlflow

        mlflow.set_tracking_uri(self.cfg.tracking.mlflow_tracking_uri)
        mlflow.set_experiment(self.cfg.trainer.project_name)
        run = mlflow.start_run(run_name=self.cfg.trainer.experiment_name)
        self.mlflow_run_id = run.info.run_id
        params = flatten(self.cfg.model_dump(mode="json"))
        # mlflow caps parameter values at 6000 characters and batches at 100 params.
        items = [(k, str(v)[:500]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            mlflow.log_params(dict(items[start:start + 100]))

    def _start_wandb(self) -> None:
        try:
            import wandb

            os.environ.setdefault("WANDB_MODE", "offline")
            self._wandb = wandb.init(project=self.cfg.trainer.project_name, name=self.cfg.trainer.experiment_name,
                                     dir=str(self.run_dir), config=self.cfg.model_dump(mode="json"))
        except Exception as exc:  # a fault boundary: wandb is optional, training is not
            log.warning("trainer.logger has wandb but it could not start (%s); continuing without it", exc)
            self._wandb = None

    def _start_ray_gauges(self) -> None:
        import ray
        from ray.util import metrics

        if not ray.is_initialized():
            return
        self._gauges = {key: metrics.Gauge(name, description=f"tandem-rl {key}")
                        for key, name in _RAY_GAUGES.items()}

    def recover_steps(self, learner_rows: list[dict[str, float]], upto: int) -> list[int]:
        """A run stopped after its learner finished and checkpointed a step but before this process logged the step's
        row (SIGTERM between the two) resumes past that step: its row is rebuilt from the learner's own line
        (``learner_metrics.jsonl``; the step's rollout metrics went with the stopped buffer) and marked ``recovered``.
        Returns the steps recovered."""
        have = {int(r["step"]) for r in self._earlier if "policy_version" in r}
        missing = [r for r in learner_rows if 1 <= int(r["step"]) <= upto and int(r["step"]) not in have]
        if missing:
            rows = self._earlier + [{**{k: float(v) for k, v in r.items() if _is_number(v)}, "recovered": 1.0}
                                    for r in missing]
            self._earlier = sorted(rows, key=lambda r: r.get("step", 0))  # stable: a step's rows keep their order
        return [int(r["step"]) for r in missing]

    def log_step(self, step: int, metrics: dict[str, float]) -> None:
        """One row per call; a training row (it has ``policy_version``) for a step already logged — the learner
        restarted in-run from a checkpoint older than that step and redid it — replaces the training rows from that
        step on, in ``metrics.jsonl`` and the history the summary and the curve read, and carries ``redone: 1``
        (mlflow, tensorboard and wandb keep every value they were sent: there the newest value of the step wins)."""
        row = {"step": step, **{k: float(v) for k, v in metrics.items() if _is_number(v)}}
        if not self.history:
            kept = [r for r in self._earlier if r.get("step", 0) < step]
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            self.history.extend(kept)
        redone = [r for r in self.history if "policy_version" in r and r["step"] >= step] if "policy_version" in row else []
        if redone:
            self.history = [r for r in self.history if not any(r is d for d in redone)]
            self.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in self.history))
            row["redone"] = 1.0
        self.history.append(row)
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.mlflow_run_id is not None:
            import mlflow

            mlflow.log_metrics({_mlflow_key(k): v for k, v in row.items() if k != "step"}, step=step)
        if self._wandb is not None:
            self._wandb.log(row, step=step)
        if self._tensorboard is not None:
            for key, value in row.items():
                if key != "step":
                    self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        for key, gauge in self._gauges.items():
            if key in row:
                gauge.set(row[key])

    def log_generations(self, step: int, samples: list[tuple[str, str, float]]) -> None:
        """``trainer.log_val_generations`` samples as an mlflow table (verl logs them to wandb/swanlab)."""
        if self.mlflow_run_id is None or not samples:
            return
        import mlflow

        inputs, outputs, scores = (list(col) for col in zip(*samples))
        mlflow.log_table({"step": [step] * len(samples), "input": inputs, "output": outputs, "score": scores},
                         artifact_file=f"val_generations/step_{step}.json")

    def finish(self, extra_artifacts: list[Path] = ()) -> Path | None:
        plot = plot_reward_curve(self.history, self.run_dir / "reward_curve.png") if self.history else None
        if self.mlflow_run_id is not None:
            import mlflow

            for path in [self.metrics_path, *([plot] if plot else []), *extra_artifacts]:
                if path and Path(path).is_file():
                    mlflow.log_artifact(str(path))
            mlflow.end_run()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tensorboard is not None:
            self._tensorboard.close()
        return plot


def _is_number(value: Any) -> bool:
    """Numbers are kept, NaN and infinities too: a diverging run must leave its trace in metrics and mlflow."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mlflow_key(key: str) -> str:
    # mlflow allows alphanumerics, _ - . / and spaces; keep ours readable.
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


def _series(history: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the rows that have ``key``."""
    rows = [row for row in history if key in row]
    return [row["step"] for row in rows], [row[key] for row in rows]


def plot_reward_curve(history: list[dict[str, float]], path: Path) -> Path:
    """Training reward (and ``reward/acc``), validation's core metrics per data source, response length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    val_keys = sorted({k for row in history for k in row if k.startswith("val-core/") and "/mean@" in k})
    panels = 3 if val_keys else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 3 * panels), sharex=True)
    ax_r, ax_l = axes[0], axes[-1]
    for key in ("reward/mean", "reward/acc"):
        steps, values = _series(history, key)
        if values:
            ax_r.plot(steps, values, marker="o", markersize=3, label=key)
    ax_r.set_ylabel("train reward")
    ax_r.grid(alpha=0.3)
    ax_r.legend()
    if val_keys:
        ax_v = axes[1]
        for key in val_keys:
            steps, values = _series(history, key)
            ax_v.plot(steps, values, marker="s", label=key.removeprefix("val-core/"))
        ax_v.set_ylabel("held-out (validation)")
        ax_v.set_ylim(-0.02, 1.02)
        ax_v.grid(alpha=0.3)
        ax_v.legend(fontsize=8)
    steps, values = _series(history, "response_length/mean")
    ax_l.plot(steps, values, color="tab:orange", marker="o", markersize=3, label="response_length/mean")
    ax_l.set_ylabel("tokens")
    ax_l.set_xlabel("step")
    ax_l.grid(alpha=0.3)
    ax_l.legend()
    fig.suptitle(f"tandem-rl — {time.strftime('%Y-%m-%d %H:%M')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
