"""What the driver hands the Ray Train workers (trainers layer), kept light: the driver builds a ``WorkerSpec``
without importing the worker loop's torch/peft/transformers stack, which only the train workers need."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from configs.actor import ActorConfig, ModelConfig
from configs.sections import AlgorithmConfig, TrainerConfig

LEARNER_METRICS = "learner_metrics.jsonl"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a training worker needs: its config sections and the handles it talks to."""

    actor: ActorConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    max_response_length: int
    temperature: float  # rollout sampling temperature: log-probs are computed at the same temperature
    run_dir: str  # absolute
    source: Any  # TrajectorySource actor handle
    publisher: Any = None  # actor handle with publish(ref), or a callable
    metrics_sink: Any = None  # actor handle with learner(metrics): the streaming driver logs them per step
    total_steps: int | None = None  # stop after this many steps; also the cosine horizon


def append_metrics(run_dir: str, metrics: dict[str, float]) -> None:
    """One line of ``<run_dir>/learner_metrics.jsonl`` (rank 0, per step)."""
    path = Path(run_dir) / LEARNER_METRICS
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(metrics, sort_keys=True) + "\n")
