"""Validation with verl's semantics and names (orchestration layer: wires agent workers to metrics and dumps).

``Validator.run(step)`` sends every validation row through the agent workers' ``validate_rows`` — the same
agent loops, tools and rollout app as training, with ``rollout.val_kwargs`` sampling and whatever adapter the
replicas sample with — and never feeds the trainer. Its samples become:
- metrics named as verl names them (``validation_metrics``): verl's ``process_validation_metrics`` per data
  source and reward key (``reward`` = the score, plus the reward's extra keys such as ``acc``), filed under
  ``val-core/<data_source>/<acc|reward>/mean@N`` (and ``maj``/``best`` at the largest N) or ``val-aux/…``, and
  ``val-aux/num_turns/{min,max,mean}``; a data source named ``<group>:<name>`` (the SQL families:
  ``sql/heldout_family:<family>``) is also reported as its group ``<group>``, over all its samples;
- verl's generation dumps (``dump_generations``: ``<dir>/<step>.jsonl`` with input, output, gts, score, step and
  the reward's keys), and verl's choice of samples to show (``pick_generations``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from agents.data.rows import DatasetRow
from agents.records import SamplingParams, ScoredSample, Termination, Trajectory
from configs import TandemConfig


def validation_metrics(samples: Sequence[ScoredSample]) -> dict[str, float]:
    """verl's validation metric dict for these samples (``RayPPOTrainer._val_metrics_update``'s naming)."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    if not samples:
        raise ValueError("no validation samples to compute metrics from")
    infos: dict[str, list[float]] = {"reward": [s.score for s in samples]}
    for key in sorted({k for s in samples for k in s.reward_extra}):
        # a failed episode (termination "failed") scores 0 on every reward key
        missing = [s.uid for s in samples if key not in s.reward_extra and s.termination != Termination.FAILED.value]
        if missing:
            raise ValueError(f"reward key {key!r} is missing from validation samples of group(s) {sorted(set(missing))[:5]}")
        infos[key] = [s.reward_extra.get(key, 0.0) for s in samples]
    uids = [s.uid for s in samples]
    by_source = process_validation_metrics([s.data_source for s in samples], uids, infos)
    groups = [group_of(s.data_source) for s in samples]
    grouped = [i for i, g in enumerate(groups) if g]
    if grouped:  # each group over its own samples (a sample's uid is unique to its row)
        by_source.update(process_validation_metrics([groups[i] for i in grouped], [uids[i] for i in grouped],
                                                    {k: [v[i] for i in grouped] for k, v in infos.items()}))
    metrics: dict[str, float] = {}
    for source, by_var in by_source.items():
        core_var = "acc" if "acc" in by_var else "reward"
        for var, by_metric in by_var.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in by_metric)
            for name, value in by_metric.items():
                core = var == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                metrics[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = float(value)
    turns = np.array([s.num_turns for s in samples], dtype=float)
    metrics.update({"val-aux/num_turns/min": float(turns.min()), "val-aux/num_turns/max": float(turns.max()),
                    "val-aux/num_turns/mean": float(turns.mean())})
    # per episode: tool calls, errors fed back, unreadable calls, generated tokens; and why episodes ended
    for name, values in (("tool_calls", [s.num_tool_calls for s in samples]),
                         ("tool_errors", [s.num_tool_errors for s in samples]),
                         ("parse_errors", [s.num_parse_errors for s in samples]),
                         ("response_length", [s.response_length for s in samples])):
        metrics[f"val-aux/{name}/mean"] = float(np.mean(values))
    metrics["val-aux/parse_errors/episode_share"] = float(np.mean([s.num_parse_errors > 0 for s in samples]))
    metrics["val-aux/parse_errors/call_share"] = (
        sum(s.num_parse_errors for s in samples) / max(1, sum(s.num_tool_calls + s.num_parse_errors for s in samples)))
    for reason in sorted({s.termination for s in samples if s.termination}):
        metrics[f"val-aux/termination/{reason}"] = float(np.mean([s.termination == reason for s in samples]))
    return metrics


def group_of(data_source: str) -> str | None:
    """``<group>`` of a data source named ``<group>:<name>``; None for other names."""
    group, sep, _ = data_source.partition(":")
    return group if sep else None


def core_accuracy(metrics: dict[str, float]) -> dict[str, float]:
    """``{data_source: value}`` of each source's headline metric: ``val-core/<source>/<acc|reward>/mean@N``."""
    out = {}
    for key, value in metrics.items():
        section, _, rest = key.partition("/")
        if section == "val-core" and "/mean@" in rest:
            source = rest.rsplit("/", 2)[0]
            out[source] = value
    return out


def _dump_rows(samples: Sequence[ScoredSample], step: int, with_reward_key: bool) -> list[dict[str, Any]]:
    rows = []
    for s in samples:
        row = {"input": s.input, "output": s.output, "gts": s.ground_truth, "score": s.score, "step": step}
        if with_reward_key:  # verl's validation dump also carries "reward" (its infos dict has it)
            row["reward"] = s.score
        row.update(s.reward_extra)
        rows.append(row)
    return rows


def dump_generations(samples: Sequence[ScoredSample], step: int, folder: str | Path, *, validation: bool) -> Path:
    """Write ``<folder>/<step>.jsonl`` as verl's ``_write_generations`` does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{step}.jsonl"
    lines = [json.dumps(row, ensure_ascii=False, default=str) for row in _dump_rows(samples, step, validation)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def scored_from_trajectories(trajectories: Sequence[Trajectory], tokenizer: Any) -> list[ScoredSample]:
    """Training samples for ``rollout_data_dir`` dumps (trajectories carry no data source or ground truth)."""
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)  # noqa: E731
    return [ScoredSample(data_source="", uid=t.group_id, input=decode(t.prompt_ids), output=decode(t.response_ids),
                         score=t.reward, reward_extra=dict(t.reward_extra), num_turns=t.num_turns,
                         num_tool_calls=t.num_tool_calls) for t in trajectories]


def pick_generations(samples: Sequence[ScoredSample], count: int) -> list[tuple[str, str, float]]:
    """verl's ``_maybe_log_val_generations`` choice: sort by input, shuffle with seed 42, take ``count``."""
    chosen = sorted(((s.input, s.output, s.score) for s in samples), key=lambda x: x[0])
    np.random.RandomState(42).shuffle(chosen)
    return chosen[:count]


@dataclass(frozen=True)
class ValidationResult:
    """One validation pass at ``step``: its ``val-core`` / ``val-aux`` metrics, the scored samples, its wall time."""

    step: int
    metrics: dict[str, float]
    samples: list[ScoredSample]
    elapsed_s: float

    def summary(self) -> str:
        """One console line: each data source's core metric, turns, tool calls, time."""
        core = core_accuracy(self.metrics)  # a source inside a reported group is left to the group's figure
        parts = [f"{source} {value:.3f}" for source, value in sorted(core.items())
                 if group_of(source) not in core]
        m = self.metrics
        return (f"validation @ step {self.step}: {', '.join(parts)} ({len(self.samples)} samples, "
                f"tool calls/episode {m['val-aux/tool_calls/mean']:.2f}, tool errors/episode "
                f"{m['val-aux/tool_errors/mean']:.2f}, unreadable calls {m['val-aux/parse_errors/call_share']:.1%}, "
                f"{m['val-aux/response_length/mean']:.0f} tokens/episode, {self.elapsed_s:.1f}s)")


def val_sampling(cfg: TandemConfig) -> SamplingParams:
    """``rollout.val_kwargs`` as sampling params: greedy unless ``do_sample`` (verl's defaults)."""
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(temperature=vk.temperature if vk.do_sample else 0.0, top_p=vk.top_p, top_k=vk.top_k)


class Validator:
    """Runs the validation rows on the agent workers; plain and picklable (the adapter bridge actor holds a copy)."""

    def __init__(self, rows: list[DatasetRow], workers: list[Any], *, n: int, sampling: SamplingParams,
                 batch_size: int | None, run_id: str):
        if not rows:
            raise ValueError("no validation rows")
        self.rows = rows
        self.workers = workers
        self.n = n
        self.sampling = sampling
        self.batch_size = batch_size or len(rows)
        self.run_id = run_id

    @classmethod
    def from_config(cls, cfg: TandemConfig, rows: list[DatasetRow], workers: list[Any], run_id: str) -> Validator:
        vk = cfg.actor_rollout_ref.rollout.val_kwargs
        return cls(rows, workers, n=vk.n, sampling=val_sampling(cfg), batch_size=cfg.data.val_batch_size,
                   run_id=run_id)

    def run(self, step: int) -> ValidationResult:
        """Validate every row (``val_batch_size`` rows in flight at once); blocks until done."""
        started = time.perf_counter()
        samples: list[ScoredSample] = []
        for start in range(0, len(self.rows), self.batch_size):
            chunk = self.rows[start:start + self.batch_size]
            share = math.ceil(len(chunk) / len(self.workers))
            calls = []
            for w, worker in enumerate(self.workers):
                part = chunk[w * share:(w + 1) * share]
                if part:
                    ids = [f"{self.run_id}-val{step}-r{start + w * share + i}" for i in range(len(part))]
                    calls.append(worker.validate_rows.remote(part, ids, n=self.n, sampling=self.sampling, step=step))
            samples.extend(s for part in ray.get(calls) for s in part)
        return ValidationResult(step, validation_metrics(samples), samples, time.perf_counter() - started)
