"""``serve deploy serve_config.yaml`` on a cluster from ``ray start --head``, called with the openai client.

The cluster is this test's own (``tests.ray_head``: its own ports and temp dir, next to the session's
``ray.init`` cluster, never stopped with ``ray stop``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.deployments.conftest import ROOT, free_port
from tests.deployments.tool_call_adapter import MESSAGES, TOOLS, build_tool_call_adapter
from tests.ray_head import BIN, ray_head, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_cluster]

APP = "tandem-rollout"


def _healthy(status: dict) -> bool:
    app = (status.get("applications") or {}).get(APP) or {}
    if app.get("status") == "DEPLOY_FAILED":
        pytest.fail(f"serve deploy failed: {app.get('message')}")
    deployments = app.get("deployments") or {}
    return app.get("status") == "RUNNING" and bool(deployments) and all(
        d.get("status") == "HEALTHY" for d in deployments.values()
    )


def _serve_status(dashboard: str, env: dict[str, str]) -> dict:
    """``serve status``, as a user asks it."""
    out = subprocess.run([BIN / "serve", "status", "-a", dashboard], env=env, capture_output=True, text=True)
    return yaml.safe_load(out.stdout or "{}") or {}


def _dashboard_status(dashboard: str) -> dict:
    """What ``serve status`` reads (the dashboard's Serve API), without starting a Python process per poll: on a
    2-core box each ``serve`` CLI call takes CPU from the replicas starting up."""
    try:
        return httpx.get(f"{dashboard}/api/serve/applications/", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}


def _model_and_adapter(tmp_path: Path) -> Path:
    """The tool-call adapter for the config's model folder (the folder is built from seed 0 if absent)."""
    from apps.make_tiny_model import build_tiny_model

    model_dir = ROOT / ".cache" / "tiny-model"
    if not (model_dir / "config.json").is_file():
        build_tiny_model(model_dir, seed=0)
    return build_tool_call_adapter(model_dir, tmp_path / "adapter")


def test_serve_deploy_config_becomes_healthy_and_serves_tool_calls(tmp_path):
    adapter = _model_and_adapter(tmp_path)
    http = free_port()
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = http  # the file's own port may be taken on a shared machine
    config_path = tmp_path / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    with ray_head(tmp_path / "ray_start.log", num_cpus=2, env=env, cwd=ROOT) as head:
        subprocess.run([BIN / "serve", "deploy", str(config_path), "-a", head.dashboard], env=env, check=True, cwd=ROOT)
        wait_for(lambda: _healthy(_dashboard_status(head.dashboard)), 300, f"app {APP} HEALTHY")
        assert _healthy(_serve_status(head.dashboard, env))
        publish = (
            "import ray; from agents.records import AdapterRef; from deployments.rollout_app import publish_adapter; "
            f"ray.init(address={head.gcs_address!r}); "
            f"print(publish_adapter({APP!r}, AdapterRef(1, {str(adapter)!r}), wait_s=120))"
        )
        subprocess.run([sys.executable, "-c", publish], env=env, check=True, cwd=ROOT)

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused", max_retries=0, timeout=120)
        response = client.chat.completions.create(
            model="tiny-model", messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=64
        )
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        assert response.system_fingerprint == "policy-v1"
        subprocess.run([BIN / "serve", "shutdown", "-y", "-a", head.dashboard], env=env, check=True)
