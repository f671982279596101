"""``python -m apps.train --config FILE [dotted.key=value ...]`` — the streaming GRPO job (apps layer).

Reads top to bottom as the data flow: rows → agent workers → rollout app → trajectory buffer →
Ray Train GRPO learner → adapter → every rollout replica. Works on a local cluster, against
``RAY_ADDRESS``, and under ``ray job submit --working-dir . -- python -m apps.train --config …``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import ray

from agents.tools.registry import load_tools
from agents.records import AdapterRef
from apps.cluster import check_cluster, on_this_node
from apps.coordinator import CoordinatorActor
from apps.coordinator import accounting as group_accounting
from apps.driver import (check_resources, connect_ray, final_adapter, load_training_rows, summary_table,
                         with_absolute_paths)
from apps.progress import Reporter, StepLog, final_paths
from apps.publishing import AdapterPublisherActor, MetricsSinkActor
from apps.rollout import attach_rollout_app, delete_rollout_app, deploy_rollout_app, deployed_apps, ingress_url
from apps.tracking import RunTracker, prepare_store
from apps.validation import Validator
from configs import ConfigError, TandemConfig, load_config
from deployments.agent_workers import AgentWorker, AgentWorkerSpec
from trainers.admission import AdmissionController
from trainers.buffer import TrajectoryBuffer
from trainers.storage import checkpoint_root
from trainers.trainer import build_trainer, read_metrics, resume_point

log = logging.getLogger("tandem_rl.train")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo_cpu.yaml", help="experiment YAML")
    parser.add_argument("--root", type=Path, help="directory the config's relative paths (model, data, outputs, "
                        "mlflow store) resolve against, and the job's working directory once they are resolved; "
                        "default: the working directory. Under `ray job submit --working-dir .` that is an uploaded "
                        "copy of the repo without .cache/: pass --root $PWD")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, as on verl's command line")
    args = parser.parse_args(argv)
    # force: an import has already given the root logger a WARNING-level handler, which would hide ours.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    return exit_code(run(load_config(args.config, args.overrides), root=args.root))


def exit_code(code: int) -> int:
    """The process's exit code. An interrupted run (130, 143) leaves Ray Train's fit thread running: exit now.
    Not through ``ray.shutdown()``: the fit thread, still inside a ``ray.get``, touched the shut-down core worker
    in 2 of 3 Ctrl-C chaos runs on a loaded box, and the core worker then ended the process with exit code 1. A
    local cluster's processes share the driver's fate (they stop when it exits); a job's actors die with their
    owner."""
    if code in (130, 143):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


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


def run(cfg: TandemConfig, root: Path | None = None) -> int:
    """Train; 0 when every step ran. Ctrl-C returns 130 and SIGTERM 143, after stopping the workers: the last
    checkpoint stays on disk and the next launch with the same run dir resumes from it."""
    install_signal_handlers()
    cfg = with_absolute_paths(cfg, root)
    if root is not None:
        # The job then works in root: what a library writes relative to the working directory (mlflow's artifact
        # store, ./mlruns) lands beside the run's other outputs, not in the uploaded copy of the repo, which Ray
        # deletes when the job ends (or sooner: another node on the same machine re-unpacking that package removed
        # the driver's working directory under it, and mlflow's Path.cwd() failed).
        os.chdir(root)
    run_dir = Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_resolved_config(cfg, run_dir)
    model = cfg.actor_rollout_ref.model
    if model.lora_adapter_path:  # fail before anything starts, naming the path and what does not fit
        from trainers.model import check_adapter

        check_adapter(model.lora_adapter_path, model.path)

    # 1. Rows (training and validation), checked against max_prompt_length with the tool schemas agents render.
    from transformers import AutoTokenizer

    tokenizer_path = model.tokenizer_path or model.path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tools = load_tools(cfg.tool_config_path) if cfg.tool_config_path else {}
    schemas = [tool.schema for tool in tools.values()]
    rows = [] if cfg.trainer.val_only else load_training_rows(cfg, tokenizer, schemas)
    val_rows = load_training_rows(cfg, tokenizer, schemas, cfg.data.val_paths) if cfg.data.val_paths else []
    batch = cfg.data.train_batch_size
    total_steps = cfg.trainer.total_training_steps or max(1, cfg.trainer.total_epochs * len(rows) // batch)
    # A run resumed from a checkpoint continues its data cursor (the rows of the steps already trained are not
    # started again) and its admission bound from the restored version, which the learner publishes first.
    resume = None if cfg.trainer.val_only else resume_point(cfg)
    if resume and resume["step"] >= total_steps:
        raise ConfigError(
            f"run {run_dir} is already at step {resume['step']} of trainer.total_training_steps={total_steps}: nothing "
            "to train. Pass a new trainer.experiment_name or trainer.default_local_dir for a new run, raise "
            "trainer.total_training_steps to continue it, or trainer.resume_mode=disable to start over")
    # Ray only once the config, data and resume point are known good: their errors come first, and fast.
    prepare_store(cfg)  # mlflow's import and store creation overlap Ray's start
    connect_ray(cfg)
    install_signal_handlers()  # again: ray.init replaced the SIGTERM handler
    attached = cfg.serve.app_name in deployed_apps()
    if attached and (cfg.serve.placement.resources or cfg.serve.placement.label_selector):
        log.warning("serve.placement is not applied: the run attaches to the rollout app %r already deployed, whose "
                    "replicas stay where they are (set the placement in its serve config instead)", cfg.serve.app_name)
    check_resources(cfg, deploy_rollout=not attached, learner=not cfg.trainer.val_only)
    # every node a role can land on: checkpoint storage, trace store and the files it reads (multi-node clusters)
    check_cluster(cfg, rows + val_rows, tools, deploy_rollout=not attached, learner=not cfg.trainer.val_only)
    tracker = RunTracker(cfg, run_dir)  # after the checks that can refuse the run: no mlflow run left open
    if resume:
        recovered = tracker.recover_steps(read_metrics(run_dir), resume["step"])
        if recovered:
            log.warning("steps %s were trained and checkpointed but their rows were not logged before the run stopped: "
                        "rebuilt from learner_metrics.jsonl (marked recovered; their rollout metrics are lost)",
                        recovered)

    # 2. The buffer (a bounded queue), the metrics sink, the publisher, and the learner: Ray Train GRPO in a thread,
    #    started first so its workers' start-up (process, imports, model load: ~30 s on a 2-core box) overlaps the
    #    rollout app's deploy and the agent workers' start. Its first publish waits until the publisher is attached
    #    (step 4); each step's metrics arrive through the sink.
    stream = cfg.stream
    buffer = ray.remote(num_cpus=0)(TrajectoryBuffer).remote(
        batch_groups=batch, capacity_groups=stream.buffer_groups, max_staleness=stream.max_staleness,
        drop_stale=stream.enabled and stream.abort_stale, keep_batches=bool(cfg.trainer.rollout_data_dir))
    validate_first = bool(val_rows) and cfg.trainer.val_before_train
    if validate_first and resume:  # the replicas sample version 0 until the learner republishes what it restored
        log.info("trainer.val_before_train: skipped on resume (validated when the run started)")
        validate_first = False
    outcome: dict = {}
    if not cfg.trainer.val_only:
        sink = MetricsSinkActor.remote()
        publisher = AdapterPublisherActor.options(**on_this_node()).remote(  # adapters also land in this run dir
            cfg.serve.app_name, None, sink, test_freq=cfg.trainer.test_freq, total_steps=total_steps,
            validate_before_train=validate_first)
        if stream.enabled and stream.max_staleness > 0 and cfg.actor_rollout_ref.actor.tis_imp_ratio_cap <= 0:
            log.warning("stream.max_staleness=%d: tokens sampled by older policy versions are trained without an "
                        "importance correction; set actor_rollout_ref.actor.tis_imp_ratio_cap (e.g. 2.0) to reweight "
                        "them by their behaviour log-probs", stream.max_staleness)
        if resume:
            print(f"resuming from the step-{resume['step']} checkpoint (policy version {resume['policy_version']}) in "
                  f"{checkpoint_root(cfg.trainer)}")
        trainer = build_trainer(cfg, source=buffer, publisher=publisher, total_steps=total_steps, metrics_sink=sink)
        fit = threading.Thread(target=lambda: outcome.update(result=trainer.fit()), daemon=True)
        fit.start()

    # 3. Rollout engines: attach to an app deployed with `serve deploy`, or deploy it; version 0 = the start policy.
    base = AdapterRef(version=0, path=model.lora_adapter_path or "")
    rollout = attach_rollout_app(cfg.serve.app_name, base=base) if attached else deploy_rollout_app(cfg, base=base)
    log.info("%s rollout app %r", "attached to" if attached else "deployed", cfg.serve.app_name)

    # 4. Agent workers, validation before training, the coordinator (admission); then the publisher may publish.
    run_id = tracker.mlflow_run_id or uuid.uuid4().hex[:8]
    spec = AgentWorkerSpec.from_config(cfg, tokenizer_path=tokenizer_path, openai_base_url=ingress_url(cfg.serve))
    tracer_factory = _tracer_factory(cfg, run_id)
    agent = cfg.actor_rollout_ref.rollout.agent
    workers = [AgentWorker.options(**agent.placement.actor_options()).remote(
        spec, rollout, buffer, tracer_factory=tracer_factory, run_id=run_id, worker_index=i)
        for i in range(agent.num_workers)]
    nodes = ray.get([worker.node_id.remote() for worker in workers])
    log.info("agent workers on node(s) %s", ", ".join(f"{n[:12]} ({nodes.count(n)})" for n in sorted(set(nodes))))
    validator = Validator.from_config(cfg, val_rows, workers, run_id) if val_rows else None
    reporter = Reporter(cfg, tracker, tokenizer)
    started = time.perf_counter()
    if cfg.trainer.val_only:
        if validator is not None:
            result = validator.run(0)
            reporter.validation(result)
            tracker.log_step(0, result.metrics)
        return _finish(cfg, tracker, reporter, attached, {}, started)
    admission = AdmissionController(batch, stream.max_staleness, streaming=stream.enabled,
                                    abort_stale=stream.abort_stale,
                                    resume_version=resume["policy_version"] if resume else 0)
    coordinator = CoordinatorActor.remote(rows, workers, buffer, admission, seed=cfg.trainer.seed,
                                          shuffle=cfg.data.shuffle, run_id=run_id,
                                          max_consecutive_failures=stream.max_failed_groups,
                                          start_position=resume["step"] * batch if resume else 0)
    ray.get(buffer.set_drop_listener.remote(coordinator))
    ray.get(publisher.attach.remote(coordinator, validator))
    coordinator_done = coordinator.run.remote()
    if validate_first:
        # Version 0 is validated while the first groups generate (both with version 0); the first publish waits for
        # it. The result reaches the console and metrics through the sink.
        publisher.validate_start.remote()

    interrupted = 0
    steps = StepLog(sink, publisher, buffer, coordinator, tracker, reporter, first_step=resume["step"] + 1 if resume else 1)
    try:
        steps.follow(fit, total_steps)
        fit.join()
        result = outcome.get("result")
        if result is None or result.error is not None:
            raise RuntimeError(f"training failed: {getattr(result, 'error', 'no result')}")
    except KeyboardInterrupt as exc:
        interrupted = 143 if isinstance(exc, Terminated) else 130
        log.warning("%s: stopping agent workers and the learner; the last checkpoint stays in %s, and the next "
                    "launch with this run dir resumes from it", "SIGTERM" if interrupted == 143 else "interrupted",
                    checkpoint_root(cfg.trainer))
        steps.take()  # the steps that finished before the interrupt reached the sink: into metrics and mlflow
    finally:
        ray.get(coordinator.stop.remote())
        ray.get(buffer.close.remote())
        admission_stats = ray.get(coordinator_done)
        failure = ray.get(coordinator.failure.remote())
        accounting = group_accounting(admission_stats, ray.get(buffer.stats.remote()))
        (run_dir / "accounting.json").write_text(json.dumps(accounting, indent=1) + "\n")
        if not accounting["groups/balanced"]:
            log.error("group accounting does not add up: %s", accounting)
    code = _finish(cfg, tracker, reporter, attached, accounting, started)
    if failure:
        raise RuntimeError(f"rollouts failed: {failure}")
    return interrupted or code


def save_resolved_config(cfg: TandemConfig, run_dir: Path) -> Path:
    """The run's whole config, every default and override resolved and paths absolute, as Hydra keeps
    ``.hydra/config.yaml``: ``apps.train --config <run dir>/config.yaml trainer.val_only=true …`` re-validates the run
    from its folder alone. A validation-only run writes ``config-val_only.yaml`` and leaves the training run's file."""
    import yaml

    path = run_dir / ("config-val_only.yaml" if cfg.trainer.val_only else "config.yaml")
    path.write_text("# resolved by apps.train: every key, defaults included\n"
                    + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


def _finish(cfg: TandemConfig, tracker: RunTracker, reporter: Reporter, attached: bool, accounting: dict,
            started: float) -> int:
    plot = tracker.finish()
    if not attached:
        delete_rollout_app(cfg.serve.app_name)
    run_dir = Path(cfg.trainer.run_dir)
    paths = final_paths(run_dir, tracker, plot, final_adapter(run_dir), cfg.tracking.mlflow_tracking_uri)
    summary_table(tracker.history, paths, accounting)
    print(f"total wall time {time.perf_counter() - started:.1f}s")
    return 0


def _tracer_factory(cfg: TandemConfig, run_id: str):
    if cfg.actor_rollout_ref.rollout.trace.backend != "mlflow":
        return None
    from apps.tracing import tracer_factory

    # Traces go to the run's mlflow experiment; every span carries the run id (AgentWorker run_id).
    return tracer_factory(cfg, experiment_name=cfg.trainer.project_name)


if __name__ == "__main__":
    from apps.driver import cli

    sys.exit(cli(main))
