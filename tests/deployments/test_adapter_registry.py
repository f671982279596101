"""The app's adapter registry on a local Ray cluster: dropped with its app, so the next app starts at version 0."""

from __future__ import annotations

import pytest
import ray

from agents.records import AdapterRef
from deployments.adapter_registry import drop_adapter_registry, get_adapter_registry

pytestmark = pytest.mark.integration


def test_a_dropped_registry_comes_back_at_policy_version_0(ray_cluster, adapter_paths):
    app = "registry-drop-test"
    registry = get_adapter_registry(app)
    # No replica is live: the publish returns at once with nobody to wait for.
    assert ray.get(registry.publish.remote(AdapterRef(3, str(adapter_paths[1])), 5.0)) == {}
    assert ray.get(get_adapter_registry(app).latest.remote()).version == 3  # same detached actor

    assert drop_adapter_registry(app) is True
    fresh = get_adapter_registry(app)
    assert ray.get(fresh.latest.remote()) == AdapterRef(0)
    assert ray.get(fresh.publish.remote(AdapterRef(1, str(adapter_paths[1])), 5.0)) == {}  # version 1 is newer again
    assert drop_adapter_registry(app) is True
    assert drop_adapter_registry(app) is False  # nothing left to drop
