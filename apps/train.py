"""``python -m apps.train --config FILE [dotted.key=value ...]`` — the streaming GRPO job (apps layer).

Reads top to bottom as the data flow: rows → agent workers → rollout app → trajectory buffer →
Ray Train GRPO learner → adapter → every rollout replica. Works on a local cluster, against
``RAY_ADDRESS``, and under ``ray job submit --working-dir . -- python -m apps.train --config …``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import uuid
from pathlib import Path

import ray
from tqdm import tqdm

from agents.tools.registry import load_tools
from apps.coordinator import CoordinatorActor
from apps.driver import (AdapterBridgeActor, connect_ray, final_adapter, load_training_rows, summary_table,
                         with_absolute_paths)
from apps.rollout import attach_rollout_app, delete_rollout_app, deploy_rollout_app, deployed_apps
from apps.tracking import RunTracker
from configs import TandemConfig, load_config
from deployments.agent_workers import AgentWorker, AgentWorkerSpec
from trainers.buffer import TrajectoryBuffer
from trainers.trainer import build_trainer

log = logging.getLogger("tandem_rl.train")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo_cpu.yaml", help="experiment YAML")
    parser.add_argument("--root", type=Path, help="directory the config's relative paths (model, data, outputs, "
                        "mlflow store) resolve against; default: the working directory. Under `ray job submit "
                        "--working-dir .` that is an uploaded copy of the repo without .cache/: pass --root $PWD")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, as on verl's command line")
    args = parser.parse_args(argv)
    # force: an import has already given the root logger a WARNING-level handler, which would hide ours.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    return run(load_config(args.config, args.overrides), root=args.root)


def run(cfg: TandemConfig, root: Path | None = None) -> int:
    cfg = with_absolute_paths(cfg, root)
    run_dir = Path(cfg.trainer.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    connect_ray(cfg)
    tracker = RunTracker(cfg, run_dir)

    # 1. Rows, checked against max_prompt_length with the tool schemas the agents will render.
    from transformers import AutoTokenizer

    model = cfg.actor_rollout_ref.model
    tokenizer_path = model.tokenizer_path or model.path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    tools = load_tools(cfg.tool_config_path) if cfg.tool_config_path else {}
    rows = load_training_rows(cfg, tokenizer, [tool.schema for tool in tools.values()])
    batch = cfg.data.train_batch_size
    total_steps = cfg.trainer.total_training_steps or max(1, cfg.trainer.total_epochs * len(rows) // batch)

    # 2. Rollout engines: attach to an app deployed with `serve deploy`, or deploy it now.
    attached = cfg.serve.app_name in deployed_apps()
    rollout = attach_rollout_app(cfg.serve.app_name) if attached else deploy_rollout_app(cfg)
    log.info("%s rollout app %r", "attached to" if attached else "deployed", cfg.serve.app_name)

    # 3. Buffer (bounded, staleness-aware), the adapter bridge, agent workers, the coordinator.
    buffer = ray.remote(num_cpus=0)(TrajectoryBuffer).remote(
        batch_groups=batch, max_staleness=cfg.stream.max_staleness,
        capacity_groups=cfg.stream.buffer_groups, streaming=cfg.stream.enabled)
    bridge = AdapterBridgeActor.remote(cfg.serve.app_name, buffer)
    run_id = tracker.mlflow_run_id or uuid.uuid4().hex[:8]
    spec = AgentWorkerSpec.from_config(cfg, tokenizer_path=tokenizer_path)
    tracer_factory = _tracer_factory(cfg, run_id)
    workers = [AgentWorker.remote(spec, rollout, buffer, tracer_factory=tracer_factory, run_id=run_id,
                                  worker_index=i) for i in range(cfg.actor_rollout_ref.rollout.agent.num_workers)]
    coordinator = CoordinatorActor.remote(rows, workers, buffer, seed=cfg.trainer.seed,
                                          shuffle=cfg.data.shuffle, run_id=run_id)
    coordinator_done = coordinator.run.remote()

    # 4. The learner: Ray Train GRPO in a thread; each step's metrics arrive through the bridge.
    trainer = build_trainer(cfg, source=buffer, publisher=bridge, total_steps=total_steps)
    outcome: dict = {}
    fit = threading.Thread(target=lambda: outcome.update(result=trainer.fit()), daemon=True)
    started = time.perf_counter()
    try:
        fit.start()
        _follow_steps(fit, bridge, buffer, coordinator, tracker, total_steps)
        fit.join()
        result = outcome.get("result")
        if result is None or result.error is not None:
            raise RuntimeError(f"training failed: {getattr(result, 'error', 'no result')}")
    except KeyboardInterrupt:
        log.warning("interrupted: stopping agent workers and the learner")
    finally:
        ray.get(coordinator.stop.remote())
        ray.get(buffer.close.remote())
        ray.get(coordinator_done)
        accounting = {k: v for k, v in ray.get(buffer.stats.remote()).items() if k.startswith("groups/")}
        plot = tracker.finish()
        if not attached:
            delete_rollout_app(cfg.serve.app_name)
    paths = {"run dir": run_dir, "metrics": tracker.metrics_path, "reward curve": plot,
             "final adapter": final_adapter(run_dir), "mlflow": cfg.tracking.mlflow_tracking_uri}
    summary_table(tracker.history, paths, accounting)
    print(f"total wall time {time.perf_counter() - started:.1f}s")
    return 0


def _follow_steps(fit, bridge, buffer, coordinator, tracker: RunTracker, total_steps: int) -> None:
    """Log each finished step (learner + rollout + buffer metrics) while the learner runs."""
    with tqdm(total=total_steps, desc="GRPO steps", unit="step") as bar:
        while fit.is_alive() or bar.n < total_steps:
            pending, switches = ray.get(bridge.take_metrics.remote())
            for switch in switches:
                for replica, version in sorted(switch["replicas"].items()):
                    # "joined": a replica autoscaling started (or one up before the run) loaded the newest adapter.
                    how = "joined" if switch["joined"] else f"{switch['sync_s']:.2f}s after publish"
                    log.info("weight sync: replica %s now samples policy version %d (%s)", replica, version, how)
            for learner in pending:
                step = int(learner["step"])
                rollout = ray.get(buffer.pop_step_metrics.remote(step))
                # learner last: the buffer's stats carry its *current* policy_version, maybe a step ahead
                metrics = {**rollout, **ray.get(buffer.stats.remote()), **ray.get(coordinator.stats.remote()), **learner,
                           "timing/step_s": learner.get("step_time_s", 0.0) + learner.get("batch_wait_s", 0.0)}
                tracker.log_step(step, metrics)
                bar.update(1)
                bar.set_postfix(reward=f"{metrics.get('reward/mean', 0):.2f}",
                                stale=f"{metrics.get('staleness/mean', 0):.1f}")
            if not pending:
                if not fit.is_alive():
                    break
                time.sleep(0.5)


def _tracer_factory(cfg: TandemConfig, run_id: str):
    if cfg.actor_rollout_ref.rollout.trace.backend != "mlflow":
        return None
    from apps.tracing import tracer_factory

    # Traces go to the run's mlflow experiment; every span carries the run id (AgentWorker run_id).
    return tracer_factory(cfg, experiment_name=cfg.trainer.project_name)


if __name__ == "__main__":
    sys.exit(main())
