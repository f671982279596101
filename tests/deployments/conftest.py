"""Session fixtures of the deployment tests: ONE local Ray cluster and ONE shared rollout app.

Starting Ray costs ~10 s and a Serve app ~10 s on the 2-core box, so every integration test of
``tests/deployments`` shares the cluster and the app (two ``RolloutServer`` replicas + the OpenAI ingress);
tests that change it (adapter publishes, a killed replica) leave it serving.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ray_head import free_port

ROOT = Path(__file__).resolve().parents[2]
APP_NAME = "tandem-test"
API_KEY_ENV = "TANDEM_TEST_API_KEY"
API_KEY = "test-token-3f9a"
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class RolloutApp:
    name: str
    handle: object  # DeploymentHandle of RolloutServer
    ingress: object  # DeploymentHandle of OpenAIIngress
    base_url: str  # http://127.0.0.1:<port>/v1
    api_key: str
    model_dir: Path
    adapters: dict[int, Path] = field(default_factory=dict)  # every version published to the app so far

    def publish_next(self, adapter: Path) -> tuple[int, dict[str, int]]:
        """Publish ``adapter`` as the next policy version; returns it and the versions by replica."""
        import ray

        from agents.records import AdapterRef
        from deployments.rollout_app import publish_adapter
        from deployments.adapter_registry import get_adapter_registry

        version = ray.get(get_adapter_registry(self.name).latest.remote()).version + 1
        self.adapters[version] = adapter
        return version, publish_adapter(self.name, AdapterRef(version, str(adapter)), wait_s=120)


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The session's shared Ray cluster (tests.ray_head.session_cluster)."""
    from tests.ray_head import session_cluster

    with session_cluster(tmp_path_factory.mktemp("session_ray"), ROOT):
        yield


@pytest.fixture(scope="session")
def adapter_paths(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Two random LoRA adapters with large B weights (different seeds)."""
    from tests.deployments.engines.tiny_assets import build_random_adapter

    root = tmp_path_factory.mktemp("serve_adapters")
    return {v: build_random_adapter(tiny_model_dir, root / f"v{v}", seed=100 + v) for v in (1, 2)}


@pytest.fixture(scope="session")
def tool_call_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter whose greedy answer to ``tool_call_adapter.MESSAGES`` is a get_weather tool call."""
    from tests.deployments.tool_call_adapter import build_tool_call_adapter

    return build_tool_call_adapter(tiny_model_dir, tmp_path_factory.mktemp("tool_call_adapter"))


@pytest.fixture(scope="package")
def rollout_app(ray_cluster, tiny_model_dir: Path) -> RolloutApp:
    """The rollout app with 2 replicas on the tiny model, 2 ingress replicas and a bearer token, shared by this package's
    tests (deleted after them: an idle app's replicas, ingress and Serve's loops took ~0.3 of a core from the tests after
    it)."""
    from ray import serve

    from deployments.rollout_app import RolloutAppArgs, build_app, ingress_handle, rollout_handle

    from ray.serve.context import _get_global_client

    os.environ[API_KEY_ENV] = API_KEY
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    # Another session fixture may have started Serve first, on its own port: ask the running proxy.
    port = _get_global_client().http_config.port
    args = RolloutAppArgs(
        model=str(tiny_model_dir),
        parser="qwen25_coder",
        max_model_len=MAX_MODEL_LEN,
        min_replicas=2,
        max_replicas=2,
        num_cpus=0.5,
        api_key_env=API_KEY_ENV,
        engine_kwargs={"max_batch_size": 32},
        ingress_replicas=2,  # two HTTP replicas share the session store: a session's calls land on either
    )
    serve.run(build_app(args), name=APP_NAME, route_prefix="/")
    yield RolloutApp(
        name=APP_NAME,
        handle=rollout_handle(APP_NAME),
        ingress=ingress_handle(APP_NAME),
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=API_KEY,
        model_dir=tiny_model_dir,
    )
    serve.delete(APP_NAME)


@pytest.fixture(scope="package", autouse=True)
def _serve_stops_after_this_package():
    """Serve (controller, proxy, whatever app a test left) stops when this package's tests end; the session's Ray
    cluster stays for tests/trainers."""
    yield
    import ray

    if ray.is_initialized():
        from ray import serve

        serve.shutdown()
