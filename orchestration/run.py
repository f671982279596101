"""The streaming GRPO run as named stages (orchestration layer); ``apps.train.run`` calls them in order.

The data flow, stage by stage: rows (checked against the prompt budget) → the cluster checked → the learner (Ray Train
GRPO in a thread, started first so its start-up overlaps the rest) → agent workers (started next, for the same reason)
→ the rollout app (deployed, or attached to one ``serve deploy`` made) → admission (the coordinator hands admitted
rows to the workers, whose groups fill the buffer the learner reads) → training, followed step by step → the finish
(summary, accounting). Signals (``Terminated``) and the resolved-config file live here too: the run owns them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from agents.records import AdapterRef
from agents.tools.registry import load_tools
from configs import ConfigError, TandemConfig
from deployments.access import token_from_env
from deployments.agent_workers import AgentWorker, AgentWorkerSpec
from deployments.rollout_app import (attach_rollout_app, delete_rollout_app, deploy_rollout_app, deployed_apps,
                                     ingress_url, rollout_handle)
from observability.tracking import RunTracker, prepare_store
from orchestration.cluster import check_cluster, on_this_node
from orchestration.coordinator import CoordinatorActor
from orchestration.coordinator import accounting as group_accounting
from orchestration.driver import (check_resources, connect_ray, final_adapter, load_training_rows, summary_table,
                                  with_absolute_paths)
from orchestration.progress import Reporter, StepLog, final_paths
from orchestration.publishing import AdapterPublisherActor, MetricsSinkActor
from orchestration.validation import Validator
from trainers.admission import AdmissionController
from trainers.buffer import TrajectoryBuffer
from trainers.storage import checkpoint_root
from trainers.trainer import build_trainer, read_metrics, resume_point

log = logging.getLogger("tandem_rl.train")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``ray job stop``, a pod's shutdown): handled as Ctrl-C, exit code 143."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def install_signal_handlers() -> None:
    """SIGTERM raises ``Terminated``; SIGINT raises ``KeyboardInterrupt`` even where the process started with it
    ignored (a shell starts background jobs, ``python -m apps.train … &``, and many supervisors that way: the run
    would then ignore ``kill -INT``; uvicorn installs its own handler for the same reason). Called again after
    ``ray.init``, whose core worker installs a failure-signal handler for SIGTERM that replaced ours and ended the
    process with a stack dump and exit code 134. Main thread only (Python's rule for signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def save_resolved_config(cfg: TandemConfig, run_dir: Path) -> Path:
    """The run's whole config, every default and override resolved and paths absolute, as Hydra keeps
    ``.hydra/config.yaml``: ``apps.train --config <run dir>/config.yaml trainer.val_only=true …`` re-validates the run
    from its folder alone. A validation-only run writes ``config-val_only.yaml`` and leaves the training run's file."""
    import yaml

    path = run_dir / ("config-val_only.yaml" if cfg.trainer.val_only else "config.yaml")
    path.write_text("# resolved by apps.train: every key, defaults included\n"
                    + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


class TrainingRun:
    """One run of the streaming GRPO job. Each stage is a method that sets what the later ones use; the order is
    ``apps.train.run``'s. Errors a user can fix (config, data, resume point, resources, cluster) are raised by the
    stages before the learner starts, fast."""

    def __init__(self, cfg: TandemConfig, root: Path | None = None):
        cfg = with_absolute_paths(cfg, root)
        if root is not None:
            # The job then works in root: what a library writes relative to the working directory (mlflow's artifact
            # store, ./mlruns) lands beside the run's other outputs, not in the uploaded copy of the repo, which Ray
            # deletes when the job ends (or sooner: another node on the same machine re-unpacking that package
            # removed the driver's working directory under it, and mlflow's Path.cwd() failed).
            os.chdir(root)
        self.cfg = cfg
        self.run_dir = Path(cfg.trainer.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_resolved_config(cfg, self.run_dir)
        model = cfg.actor_rollout_ref.model
        if model.lora_adapter_path:  # fail before anything starts, naming the path and what does not fit
            from trainers.model import check_adapter

            check_adapter(model.lora_adapter_path, model.path)
        self.outcome: dict[str, Any] = {}
        self.started = time.perf_counter()
        self.accounting: dict[str, float] = {}
        self.failure: str | None = None

    @property
    def learning(self) -> bool:
        return not self.cfg.trainer.val_only

    def load_rows(self) -> None:
        """Training and validation rows, checked against max_prompt_length with the tool schemas agents render; the
        step count and the resume point (a resumed run continues its data cursor and its admission bound)."""
        from transformers import AutoTokenizer

        cfg, model = self.cfg, self.cfg.actor_rollout_ref.model
        self.tokenizer_path = model.tokenizer_path or model.path
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        self.tools = load_tools(cfg.tool_config_path) if cfg.tool_config_path else {}
        schemas = [tool.schema for tool in self.tools.values()]
        self.rows = load_training_rows(cfg, self.tokenizer, schemas) if self.learning else []
        self.val_rows = load_training_rows(cfg, self.tokenizer, schemas, cfg.data.val_paths) if cfg.data.val_paths else []
        self.batch = cfg.data.train_batch_size
        self.total_steps = cfg.trainer.total_training_steps or max(
            1, cfg.trainer.total_epochs * len(self.rows) // self.batch)
        self.resume = resume_point(cfg) if self.learning else None
        if self.resume and self.resume["step"] >= self.total_steps:
            raise ConfigError(
                f"run {self.run_dir} is already at step {self.resume['step']} of trainer.total_training_steps="
                f"{self.total_steps}: nothing to train. Pass a new trainer.experiment_name or trainer.default_local_dir "
                "for a new run, raise trainer.total_training_steps to continue it, or trainer.resume_mode=disable to "
                "start over")

    def check_cluster(self) -> None:
        """Ray (only once the config, data and resume point are known good), its resources and every node a role can
        land on (checkpoint storage, trace store, the files rows and tools read); then the tracker."""
        cfg = self.cfg
        # before Ray starts: a named but unset key variable is a one-line error, not an open ingress
        self.api_token = token_from_env(cfg.serve.api_key_env, "serve.api_key_env")
        prepare_store(cfg)  # mlflow's import and store creation overlap Ray's start
        connect_ray(cfg)
        install_signal_handlers()  # again: ray.init replaced the SIGTERM handler
        self.attached = cfg.serve.app_name in deployed_apps()
        if self.attached and (cfg.serve.placement.resources or cfg.serve.placement.label_selector):
            log.warning("serve.placement is not applied: the run attaches to the rollout app %r already deployed, "
                        "whose replicas stay where they are (set the placement in its serve config instead)",
                        cfg.serve.app_name)
        check_resources(cfg, deploy_rollout=not self.attached, learner=self.learning)
        check_cluster(cfg, self.rows + self.val_rows, self.tools, deploy_rollout=not self.attached,
                      learner=self.learning)
        self.tracker = RunTracker(cfg, self.run_dir)  # after the checks that can refuse the run: no mlflow run left open
        if self.resume:
            recovered = self.tracker.recover_steps(read_metrics(self.run_dir), self.resume["step"])
            if recovered:
                log.warning("steps %s were trained and checkpointed but their rows were not logged before the run "
                            "stopped: rebuilt from learner_metrics.jsonl (marked recovered; their rollout metrics are "
                            "lost)", recovered)

    def start_learner(self) -> None:
        """The buffer (a bounded queue), the metrics sink, the publisher, and the learner: Ray Train GRPO in a thread,
        started before the rollout app so its workers' start-up (process, imports, model load: ~30 s on a 2-core box)
        overlaps the deploy and the agent workers' start. Its first publish waits until the publisher is attached
        (``admit``); each step's metrics arrive through the sink."""
        cfg, stream = self.cfg, self.cfg.stream
        self.buffer = ray.remote(num_cpus=0)(TrajectoryBuffer).remote(
            batch_groups=self.batch, capacity_groups=stream.buffer_groups, max_staleness=stream.max_staleness,
            drop_stale=stream.enabled and stream.abort_stale, keep_batches=bool(cfg.trainer.rollout_data_dir))
        self.validate_first = bool(self.val_rows) and cfg.trainer.val_before_train
        if self.validate_first and self.resume:  # replicas sample version 0 until the learner republishes its restore
            log.info("trainer.val_before_train: skipped on resume (validated when the run started)")
            self.validate_first = False
        if not self.learning:
            return
        self.sink = MetricsSinkActor.remote()
        self.publisher = AdapterPublisherActor.options(**on_this_node()).remote(  # adapters also land in the run dir
            cfg.serve.app_name, None, self.sink, test_freq=cfg.trainer.test_freq, total_steps=self.total_steps,
            validate_before_train=self.validate_first)
        if stream.enabled and stream.max_staleness > 0 and cfg.actor_rollout_ref.actor.tis_imp_ratio_cap <= 0:
            log.warning("stream.max_staleness=%d: tokens sampled by older policy versions are trained without an "
                        "importance correction; set actor_rollout_ref.actor.tis_imp_ratio_cap (e.g. 2.0) to reweight "
                        "them by their behaviour log-probs", stream.max_staleness)
        if self.resume:
            print(f"resuming from the step-{self.resume['step']} checkpoint (policy version "
                  f"{self.resume['policy_version']}) in {checkpoint_root(cfg.trainer)}")
        trainer = build_trainer(cfg, source=self.buffer, publisher=self.publisher, total_steps=self.total_steps,
                                metrics_sink=self.sink)
        self.fit = threading.Thread(target=lambda: self.outcome.update(result=trainer.fit()), daemon=True)
        self.fit.start()

    def start_agent_workers(self) -> None:
        """The agent workers (they call the rollout app, tools, and put finished groups in the buffer), the validator
        and the reporter. Started before the rollout app is deployed, as the learner is: each worker's start-up
        (process, imports, tokenizer: ~10 CPU-s) overlaps the deploy; their handle finds the replicas at its first
        call, which comes after ``deploy`` (rows are admitted only then)."""
        cfg = self.cfg
        self.run_id = self.tracker.mlflow_run_id or uuid.uuid4().hex[:8]
        spec = AgentWorkerSpec.from_config(cfg, tokenizer_path=self.tokenizer_path,
                                           openai_base_url=ingress_url(cfg.serve),
                                           openai_api_key=self.api_token.secret() if self.api_token else "")
        tracer_factory = _tracer_factory(cfg)
        agent = cfg.actor_rollout_ref.rollout.agent
        rollout = rollout_handle(cfg.serve.app_name, deployed=False)
        self.workers = [AgentWorker.options(**agent.placement.actor_options()).remote(
            spec, rollout, self.buffer, tracer_factory=tracer_factory, run_id=self.run_id, worker_index=i)
            for i in range(agent.num_workers)]
        self.validator = Validator.from_config(cfg, self.val_rows, self.workers, self.run_id) if self.val_rows else None
        self.reporter = Reporter(cfg, self.tracker, self.tokenizer)

    def deploy(self) -> None:
        """The rollout engines: attach to an app deployed with ``serve deploy``, or deploy it; version 0 is the start
        policy (the base model, or ``model.lora_adapter_path``). Then every agent worker started (an error in one's
        constructor is raised here) and where they run logged."""
        cfg = self.cfg
        base = AdapterRef(version=0, path=cfg.actor_rollout_ref.model.lora_adapter_path or "")
        if self.attached:
            attach_rollout_app(cfg.serve.app_name, base=base)
        else:
            deploy_rollout_app(cfg, base=base)
        log.info("%s rollout app %r", "attached to" if self.attached else "deployed", cfg.serve.app_name)
        nodes = ray.get([worker.node_id.remote() for worker in self.workers])
        log.info("agent workers on node(s) %s", ", ".join(f"{n[:12]} ({nodes.count(n)})" for n in sorted(set(nodes))))
        self.started = time.perf_counter()

    def validate_only(self) -> int:
        """``trainer.val_only``: one validation of the start policy, then the finish."""
        if self.validator is not None:
            result = self.validator.run(0)
            self.reporter.validation(result)
            self.tracker.log_step(0, result.metrics)
        return self.finish()

    def admit(self) -> None:
        """The admission controller and the coordinator: rows go to agent workers within the staleness bound from
        here on; the publisher is attached (its first publish may go out) and validation before training starts."""
        cfg, stream, resume = self.cfg, self.cfg.stream, self.resume
        admission = AdmissionController(self.batch, stream.max_staleness, streaming=stream.enabled,
                                        abort_stale=stream.abort_stale,
                                        resume_version=resume["policy_version"] if resume else 0,
                                        total_groups=(self.total_steps - (resume["step"] if resume else 0)) * self.batch)
        self.coordinator = CoordinatorActor.remote(
            self.rows, self.workers, self.buffer, admission, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle,
            run_id=self.run_id, max_consecutive_failures=stream.max_failed_groups,
            start_position=resume["step"] * self.batch if resume else 0)
        ray.get(self.buffer.set_drop_listener.remote(self.coordinator))
        ray.get(self.publisher.attach.remote(self.coordinator, self.validator))
        self.coordinator_done = self.coordinator.run.remote()
        if self.validate_first:
            # Version 0 is validated while the first groups generate (both with version 0); the first publish waits
            # for it. The result reaches the console and metrics through the sink.
            self.publisher.validate_start.remote()

    def train(self) -> int:
        """Follow the learner step by step until it ends; 0, or 130 (Ctrl-C) / 143 (SIGTERM) after stopping the
        workers. Every admitted group is accounted for (``accounting.json``) however the run ended."""
        interrupted = 0
        steps = StepLog(self.sink, self.publisher, self.buffer, self.coordinator, self.tracker, self.reporter,
                        first_step=self.resume["step"] + 1 if self.resume else 1)
        try:
            steps.follow(self.fit, self.total_steps)
            self.fit.join()
            result = self.outcome.get("result")
            if result is None or result.error is not None:
                raise RuntimeError(f"training failed: {getattr(result, 'error', 'no result')}")
        except KeyboardInterrupt as exc:
            interrupted = 143 if isinstance(exc, Terminated) else 130
            log.warning("%s: stopping agent workers and the learner; the last checkpoint stays in %s, and the next "
                        "launch with this run dir resumes from it", "SIGTERM" if interrupted == 143 else "interrupted",
                        checkpoint_root(self.cfg.trainer))
            steps.take()  # the steps that finished before the interrupt reached the sink: into metrics and mlflow
        finally:
            ray.get(self.coordinator.stop.remote())
            ray.get(self.buffer.close.remote())
            admission_stats = ray.get(self.coordinator_done)
            self.failure = ray.get(self.coordinator.failure.remote())
            self.accounting = group_accounting(admission_stats, ray.get(self.buffer.stats.remote()))
            (self.run_dir / "accounting.json").write_text(json.dumps(self.accounting, indent=1) + "\n")
            if not self.accounting["groups/balanced"]:
                log.error("group accounting does not add up: %s", self.accounting)
        return interrupted

    def finish(self) -> int:
        """The reward curve, the rollout app removed unless the run attached to it, the summary table; raises when the
        coordinator stopped on failed rollouts."""
        plot = self.tracker.finish()
        if not self.attached:
            delete_rollout_app(self.cfg.serve.app_name)
        paths = final_paths(self.run_dir, self.tracker, plot, final_adapter(self.run_dir),
                            self.cfg.tracking.mlflow_tracking_uri)
        summary_table(self.tracker.history, paths, self.accounting)
        print(f"total wall time {time.perf_counter() - self.started:.1f}s")
        if self.failure:
            raise RuntimeError(f"rollouts failed: {self.failure}")
        return 0


def _tracer_factory(cfg: TandemConfig):
    if cfg.actor_rollout_ref.rollout.trace.backend != "mlflow":
        return None
    from observability.tracing import tracer_factory

    # Traces go to the run's mlflow experiment; every span carries the run id (AgentWorker run_id).
    return tracer_factory(cfg, experiment_name=cfg.trainer.project_name)
