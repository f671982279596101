"""The resource plan is checked before anything is deployed: a config that cannot be placed fails in seconds,
naming each part's demand, the cluster's total and the keys to change."""

from __future__ import annotations

import pytest

from orchestration import driver
from configs import load_config

pytestmark = pytest.mark.unit


def _cfg(*overrides: str):
    return load_config("configs/demo_cpu.yaml", ["trainer.device=cpu", *overrides])


def test_two_half_cpu_replicas_ingress_and_learner_do_not_fit_two_cpus(monkeypatch):
    monkeypatch.setattr(driver.ray, "cluster_resources", lambda: {"CPU": 2.0})
    cfg = _cfg("serve.min_replicas=2", "serve.max_replicas=2", "serve.num_cpus_per_replica=0.5")
    with pytest.raises(RuntimeError) as error:
        driver.check_resources(cfg, deploy_rollout=True)
    text = str(error.value)
    assert "2.1 CPUs asked, the cluster has 2" in text
    assert "serve.max_replicas=2 × serve.num_cpus_per_replica=0.5" in text and "Ray Train workers" in text
    driver.check_resources(_cfg("serve.max_replicas=2", "serve.num_cpus_per_replica=0.4"), deploy_rollout=True)


def test_autoscaling_headroom_counts_and_an_attached_app_is_checked_against_what_is_free(monkeypatch):
    monkeypatch.setattr(driver.ray, "cluster_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(driver.ray, "available_resources", lambda: {"CPU": 0.5})
    with pytest.raises(RuntimeError, match="4.1 CPUs asked"):  # max_replicas, not min_replicas
        driver.check_resources(_cfg("serve.min_replicas=1", "serve.max_replicas=6"), deploy_rollout=True)
    with pytest.raises(RuntimeError, match="1 CPUs asked, the cluster has 0.5 free"):  # only the learner is new
        driver.check_resources(_cfg(), deploy_rollout=False)
    plan = driver.resource_plan(_cfg(), deploy_rollout=False, learner=False)
    assert plan == {}  # val_only on an attached app asks nothing new


def test_a_taken_dashboard_port_gives_a_free_one():
    import socket

    from orchestration.driver import _dashboard_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        other = _dashboard_port(default=taken)
        assert other != taken
    with socket.socket() as free:  # the port it gave is one a server can listen on
        free.bind(("127.0.0.1", other))


def test_the_machine_lock_around_ray_init_holds_off_another_process():
    """Two runs started together take turns choosing the dashboard's port and starting Ray (the lock is a file,
    shared by processes: a second process waits until the first lets go)."""
    import subprocess
    import sys
    import time

    from orchestration.driver import _machine_lock

    probe = ("from orchestration.driver import _machine_lock\nprint('waiting', flush=True)\n"
             "with _machine_lock('test-lock'): print('got it', flush=True)")
    with _machine_lock("test-lock"):
        other = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "waiting"
        time.sleep(1)
        assert other.poll() is None  # blocked on the lock this process holds
    assert other.stdout.readline().strip() == "got it"
    assert other.wait(timeout=60) == 0
