"""A private ``ray start --head --block`` cluster for tests of the Ray CLIs (``serve deploy``, ``ray job submit``),
and a second node that joins it with ``ray start --address`` (a two-node cluster on one machine).

Its own temp dir and free ports let it run next to the session's ``ray.init`` cluster. It is stopped by
terminating the process group of the ``ray start --block`` process, never with ``ray stop``, which stops
every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import httpx

BIN = Path(sys.executable).parent


# A node stopped with SIGTERM first drains (waits up to 30 s for its tasks and actors, a detached Serve controller
# among them, to go); a test's cluster has nothing left to drain for when it is stopped.
NO_DRAIN = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _agent_ports() -> dict[str, int]:
    """Ports every node opens; free ones, so a node starts next to the session's cluster and the other node."""
    return {"--dashboard-agent-listen-port": free_port(), "--dashboard-agent-grpc-port": free_port(),
            "--metrics-export-port": free_port(), "--runtime-env-agent-port": free_port()}


@dataclass(frozen=True)
class RayHead:
    gcs_address: str  # 127.0.0.1:<port>, for ray.init
    dashboard: str  # http://127.0.0.1:<port>, for `ray job` / `serve` CLIs
    env: dict[str, str]  # what the CLIs need: this venv first on PATH, auth settings


POLL_S = 2.0  # how often wait_for asks


def wait_for(check: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        time.sleep(POLL_S)
    return result


def _answers(url: str, token: str | None) -> bool:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.get(url, headers=headers, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def ray_head(log_path: Path, num_cpus: int, env: dict[str, str], cwd: Path,
             resources: dict[str, float] | None = None) -> Iterator[RayHead]:
    """Start the head with ``env`` (its processes, and the jobs they run, inherit it) and custom ``resources``;
    stop it on exit."""

    gcs, dash = free_port(), free_port()
    temp_dir = tempfile.mkdtemp(prefix="rh")  # short: Ray's unix socket paths live under it
    ports = {"--port": gcs, "--dashboard-port": dash, "--ray-client-server-port": free_port(), **_agent_ports()}
    with open(log_path, "w") as log:
        head = subprocess.Popen(
            [BIN / "ray", "start", "--head", "--block", f"--num-cpus={num_cpus}", "--include-dashboard=true",
             "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
             f"--temp-dir={temp_dir}", *(f"{flag}={port}" for flag, port in ports.items()),
             *([f"--resources={json.dumps(resources)}"] if resources else [])],
            # RAY_ADDRESS: the cluster's own processes (Ray Train's placement-group cleaner asks the state API whether
            # its controller lives) must ask this cluster, not whichever other one runs on the machine
            cwd=cwd, env={**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}", **NO_DRAIN}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    dashboard = f"http://127.0.0.1:{dash}"
    try:
        token = env.get("RAY_AUTH_TOKEN") if env.get("RAY_AUTH_MODE") == "token" else None
        # The dashboard answering is not enough for `ray job submit`: the head's dashboard agent, a process of its own,
        # runs the job, and the dashboard waits only 10 s for it (ray.dashboard.consts.WAIT_AVAILABLE_AGENT_TIMEOUT)
        # before answering "No available agent to submit job" (a CI run submitted so on a loaded box). The agent
        # registers itself right after its HTTP server starts: its health check answering is the cue.
        agent = f"http://127.0.0.1:{ports['--dashboard-agent-listen-port']}/api/healthz"
        wait_for(lambda: (_answers(f"{dashboard}/api/version", token) and _answers(agent, token))
                 or head.poll() is not None, 180, "Ray dashboard and the head's dashboard agent up")
        assert head.poll() is None, f"ray start exited with {head.returncode}:\n{log_path.read_text()[-3000:]}"
        yield RayHead(f"127.0.0.1:{gcs}", dashboard, env)
    finally:
        _stop(head)
        shutil.rmtree(temp_dir, ignore_errors=True)


# Ray gives a joining node's raylet a fixed 30 s to register with GCS (ray/_private/node.py, not configurable); on a
# 2-core box saturated by the other xdist worker (load average 24 measured) one fresh-clone run's second node missed it
# ("The current node timed out during startup"). Such a node is started once more; any other exit fails at once.
REGISTRATION_TIMEOUT = "The current node timed out during startup"


@contextlib.contextmanager
def ray_node(head: RayHead, log_path: Path, num_cpus: int, resources: dict[str, float], cwd: Path,
             attempts: int = 2) -> Iterator[str]:
    """A second node joining ``head`` with its own custom ``resources``, started in ``cwd``; yields its node id. A
    start that missed Ray's registration deadline is made again, up to ``attempts`` starts; each start has its own
    node-manager port, and the node found is the one on the last start's port (an earlier start's raylet that
    registered late and was killed stays "alive" in GCS until its health check fails)."""

    def start() -> tuple[subprocess.Popen, int, int]:
        port, offset = free_port(), log_path.stat().st_size
        with open(log_path, "a") as log:
            return subprocess.Popen(
                [BIN / "ray", "start", f"--address={head.gcs_address}", "--block", f"--num-cpus={num_cpus}",
                 f"--resources={json.dumps(resources)}", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                 f"--node-manager-port={port}", *(f"{flag}={p}" for flag, p in _agent_ports().items())],
                cwd=cwd, env={**head.env, **NO_DRAIN}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ), port, offset

    log_path.write_text("")
    (node, port, offset), tries = start(), 1
    try:
        name = next(iter(resources))

        def joined() -> str | None:
            nonlocal node, port, offset, tries
            this_start = log_path.read_text()[offset:]
            if node.poll() is not None and tries < attempts and REGISTRATION_TIMEOUT in this_start:
                print("ray start (second node) missed Ray's 30 s registration deadline; starting it again")
                _stop(node)
                (node, port, offset), tries = start(), tries + 1
                return None
            assert node.poll() is None, f"ray start exited with {node.returncode}:\n{this_start[-3000:]}"
            probe = [str(BIN / "python"), "-c", "import ray, json; ray.init(address='%s', logging_level='ERROR'); "
                     "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive'] and '%s' in n['Resources'] "
                     "and n['NodeManagerPort'] == %d]))" % (head.gcs_address, name, port)]
            out = subprocess.run(probe, env=head.env, capture_output=True, text=True, timeout=120).stdout
            ids = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
            return ids[0] if ids else None

        yield wait_for(joined, 120 * attempts, "second Ray node joined")
    finally:
        _stop(node)


def _stop(head: subprocess.Popen) -> None:
    """SIGTERM to the ``ray start --block`` process, which stops its node (without draining: ``NO_DRAIN``); then
    SIGKILL to whatever of its process group is left (after 60 s if it has not exited by then). Only that process gets
    the SIGTERM: with the whole group signalled, GCS was gone before the node's drain call reached it."""
    if head.poll() is None:
        os.kill(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.pid, signal.SIGKILL)
    head.wait(timeout=30)


@contextlib.contextmanager
def session_cluster(log_dir: Path, root: Path) -> Iterator[None]:
    """The test session's one shared cluster (16 logical CPUs: every tier shares it; token auth off; workers import
    the repo at ``root``), unless one is connected already. Started with ``ray start --head`` so that its own
    processes know its address: Ray Train's placement-group cleaner asks the state API whether its controller lives,
    and on a machine where another test's cluster runs (the own_cluster tests beside these) an address-less query
    reached the other cluster, found no such actor, and removed the placement group of a training run in progress."""
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    if ray.is_initialized():
        yield
        return
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    log_dir.mkdir(parents=True, exist_ok=True)
    with ray_head(log_dir / "ray_start.log", num_cpus=16, env=env, cwd=root) as head:
        ray.init(address=head.gcs_address, log_to_driver=False)
        try:
            yield
        finally:
            from ray import serve

            serve.shutdown()
            ray.shutdown()
