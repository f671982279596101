"""What a training run shows while it runs (orchestration layer): one progress bar of GRPO steps, one line per
validation, each step's metrics to the tracker, verl's generation dumps.

``StepLog`` takes finished steps, validations and replica switches from the metrics sink, joins each
step's learner metrics with the buffer's rollout metrics of that step, the admission counts and the validation
taken at it (``merge_sources``: a key two sources report must agree), and hands the row to the ``RunTracker``.
``Reporter`` owns the console lines and dump files of validations and training batches.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray
from tqdm import tqdm

from orchestration.driver import merge_sources
from observability.tracking import RunTracker
from orchestration.validation import ValidationResult, dump_generations, pick_generations, scored_from_trajectories
from configs import TandemConfig

log = logging.getLogger("tandem_rl.progress")


class Reporter:
    """Validation lines, ``log_val_generations`` samples, ``validation_data_dir``/``rollout_data_dir`` dumps."""

    def __init__(self, cfg: TandemConfig, tracker: RunTracker, tokenizer: Any):
        self.trainer = cfg.trainer
        self.tracker = tracker
        self.tokenizer = tokenizer
        self.validations: list[ValidationResult] = []

    def validation(self, result: ValidationResult, write: Any = print) -> None:
        """Console line, samples, dump; the metrics themselves go with the step's row (``StepLog``)."""
        self.validations.append(result)
        write(result.summary())
        shown = pick_generations(result.samples, self.trainer.log_val_generations)
        for text_in, text_out, score in shown:
            write(f"  [score {score:.2f}] {_tail(text_in, 80)!r} → {_tail(text_out, 160)!r}")
        if shown:
            self.tracker.log_generations(result.step, shown)
        if self.trainer.validation_data_dir:
            dump_generations(result.samples, result.step, self.trainer.validation_data_dir, validation=True)

    def training_batch(self, step: int, trajectories: list) -> None:
        if self.trainer.rollout_data_dir and trajectories:
            samples = scored_from_trajectories(trajectories, self.tokenizer)
            dump_generations(samples, step, self.trainer.rollout_data_dir, validation=False)


def _tail(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-limit:]


class StepLog:
    """Takes what reached the metrics sink and logs it: switches, validations, and each finished step's row
    (learner + rollout + admission metrics, and its validation). A learner that Ray Train restarted from a
    checkpoint repeats the steps after it: said once, logged again."""

    def __init__(self, sink, publisher, buffer, coordinator, tracker: RunTracker, reporter: Reporter,
                 first_step: int = 1):
        self.sink, self.publisher, self.buffer, self.coordinator = sink, publisher, buffer, coordinator
        self.tracker, self.reporter = tracker, reporter
        self.pending_val: dict[int, ValidationResult] = {}
        self.last_step = first_step - 1
        self.want_batches = bool(reporter.trainer.rollout_data_dir)

    def take(self, bar: Any = None) -> bool:
        """Log everything the sink holds now; True when there was a step or a validation."""
        ray.get(self.publisher.report_joined.remote())
        reports = ray.get(self.sink.take.remote())
        write = tqdm.write if bar is not None else print
        for switch in reports.switches:
            for replica, version in sorted(switch["replicas"].items()):
                # "joined": a replica autoscaling started (or one up before the run) loaded the newest adapter.
                how = "joined" if switch["joined"] else f"{switch['sync_s']:.2f}s after publish"
                node = switch.get("nodes", {}).get(replica, "")
                log.info("weight sync: replica %s%s now samples policy version %d (%s)", replica,
                         f" on node {node[:12]}" if node else "", version, how)
        for result in reports.validations:
            self.reporter.validation(result, write=write)
            if result.step == 0:  # before training: no learner row to join
                self.tracker.log_step(0, result.metrics)
            else:
                self.pending_val[result.step] = result
        for learner in reports.learner:
            self._step(learner, write, bar)
        return bool(reports.learner or reports.validations)

    def _step(self, learner: dict[str, float], write: Any, bar: Any) -> None:
        step = int(learner["step"])
        if step <= self.last_step:
            write(f"learner restarted: step {step} again, now at policy version "
                  f"{int(learner.get('policy_version', -1))} (was at step {self.last_step})")
        self.last_step = step
        if self.want_batches:
            self.reporter.training_batch(step, ray.get(self.buffer.pop_step_batch.remote(step)))
        val = self.pending_val.pop(step).metrics if step in self.pending_val else {}
        metrics = merge_sources(
            rollout=ray.get(self.buffer.pop_step_metrics.remote(step)), buffer=ray.get(self.buffer.stats.remote()),
            admission=ray.get(self.coordinator.stats.remote()), validation=val, learner=learner,
            driver={"timing/step_s": learner.get("step_time_s", 0.0) + learner.get("batch_wait_s", 0.0)})
        self.tracker.log_step(step, metrics)
        if bar is not None:
            bar.update(max(0, step - bar.n))
            bar.set_postfix(reward=f"{metrics.get('reward/mean', 0):.2f}",
                            acc=f"{metrics.get('reward/acc', float('nan')):.2f}",
                            calls=f"{metrics.get('tool_calls/mean', 0):.2f}",
                            bad_calls=int(metrics.get("tool_parse_errors/sum", 0)))

    def follow(self, fit, total_steps: int) -> None:
        """Log while the learner runs, with a progress bar of GRPO steps."""
        with tqdm(total=total_steps, initial=self.last_step, desc="GRPO steps", unit="step",
                  dynamic_ncols=True) as bar:
            while fit.is_alive() or bar.n < total_steps:
                if not self.take(bar):
                    if not fit.is_alive():
                        break
                    time.sleep(0.5)


def final_paths(run_dir: Path, tracker: RunTracker, plot: Path | None, adapter: Path | None, mlflow_uri: str) -> dict:
    """The run's outputs for the summary table: run dir, metrics file, reward curve, final adapter, mlflow store."""
    return {"run dir": run_dir, "metrics": tracker.metrics_path, "reward curve": plot, "final adapter": adapter,
            "mlflow": mlflow_uri}
