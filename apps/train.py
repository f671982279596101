"""``python -m apps.train --config FILE [dotted.key=value ...]`` — the streaming GRPO job (apps layer).

Reads top to bottom as the data flow: rows → agent workers → rollout app → trajectory buffer →
Ray Train GRPO learner → adapter → every rollout replica. Works on a local cluster, against
``RAY_ADDRESS``, and under ``ray job submit --working-dir . -- python -m apps.train --config …``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from configs import TandemConfig, load_config
from orchestration.run import Terminated, TrainingRun, install_signal_handlers, save_resolved_config

__all__ = ["Terminated", "exit_code", "install_signal_handlers", "main", "run", "save_resolved_config"]


def main(argv: list[str] | None = None) -> int:
    """The command line: ``--config``, ``--root`` and dotted overrides."""
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


def run(cfg: TandemConfig, root: Path | None = None) -> int:
    """Train; 0 when every step ran. Ctrl-C returns 130 and SIGTERM 143, after stopping the workers: the last
    checkpoint stays on disk and the next launch with the same run dir resumes from it. The stages are
    ``orchestration.run.TrainingRun``'s methods, in data-flow order."""
    install_signal_handlers()
    job = TrainingRun(cfg, root)  # paths resolved, run dir and its resolved config.yaml, the start adapter checked
    job.load_rows()
    job.check_cluster()
    job.start_learner()
    job.start_agent_workers()
    job.deploy()
    if not job.learning:
        return job.validate_only()
    job.admit()
    interrupted = job.train()
    return job.finish() or interrupted


if __name__ == "__main__":
    from orchestration.driver import cli

    sys.exit(cli(main))
