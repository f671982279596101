"""The newest LoRA adapter of a rollout app, as a named Ray actor (deployments layer).

The trainer publishes each ``AdapterRef`` here once; every ``RolloutServer`` replica reads the newest
ref in its constructor (so a replica that autoscaling starts later loads it before it serves) and then
long-polls ``wait_newer`` to hear about the next one. ``publish`` returns only when every live replica
has acknowledged the new version, so "published" means "sampled with from now on" — the failure where
rollouts silently keep sampling the old policy (verl #7495) shows up as a ``TimeoutError`` naming the
lagging replicas, not as quietly stale data; a replica that cannot load the adapter reports why
(``load_failed``), and the publish fails at once with that cause.

A new training run on an app that outlives runs (deployed with ``serve deploy``) starts with
``reset``: every replica goes back to the run's starting policy, version 0 (the base model, or the saved
adapter the run starts from), and published versions count from 1 again. Replicas follow the registry's
ref exactly (version and path), so they also follow it back.

Liveness is by heartbeat: a replica that has not called in for ``liveness_s`` is presumed gone (killed,
downscaled) and is not waited for. The registry outlives its creator (detached); whoever deletes the
app drops it too (``drop_adapter_registry``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import ray
from ray.actor import ActorHandle

from agents.records import AdapterRef

REGISTRY_NAMESPACE = "tandem"


def registry_name(app_name: str) -> str:
    """The Ray actor name of ``app_name``'s ``AdapterRegistry`` (in ``REGISTRY_NAMESPACE``), by which the trainer and
    the replicas find it."""
    return f"{app_name}:adapter-registry"


@ray.remote(num_cpus=0)
class AdapterRegistry:
    """Holds the newest ``AdapterRef`` and which version each live replica has loaded."""

    def __init__(self, liveness_s: float = 15.0) -> None:
        self._latest = AdapterRef(version=0)
        self._changed = asyncio.Event()
        self._liveness_s = liveness_s
        self._loaded: dict[str, tuple[int, str]] = {}  # replica -> (version, path) it samples with
        self._last_seen: dict[str, float] = {}
        self._failed: dict[str, tuple[int, str, str]] = {}  # replica -> (version, path, error) it could not load
        self._nodes: dict[str, str] = {}  # replica -> the Ray node it runs on

    def latest(self) -> AdapterRef:
        return self._latest

    async def publish(self, ref: AdapterRef, wait_s: float = 120.0) -> dict[str, int]:
        """Make ``ref`` the newest adapter; return ``{replica_id: version}`` once all live replicas loaded it."""
        if ref.version < self._latest.version or (ref.version == self._latest.version and ref != self._latest):
            raise ValueError(
                f"adapter version {ref.version} ({ref.path!r}) is not newer than the published "
                f"version {self._latest.version} ({self._latest.path!r})"
            )
        if ref != self._latest:
            self._set_latest(await self._own_copy(ref))
        return await self.wait_loaded(ref.version, wait_s)

    async def _own_copy(self, ref: AdapterRef) -> AdapterRef:
        """``ref`` with its files re-put by this actor, which owns them from now on. The learner's copy dies with
        its worker (a restart, the end of a run), while a replica that starts later on another node still loads
        the newest adapter from here (the registry outlives runs)."""
        if ref.files is None:
            return ref
        return replace(ref, files=ray.put(await ref.files))

    async def reset(self, wait_s: float = 120.0, base: AdapterRef = AdapterRef(version=0)) -> dict[str, int]:
        """Back to ``base``, the new training run's starting policy (version 0: the base model, or with a
        path the saved adapter it starts from); returns once every live replica samples with it."""
        if base.version != 0:
            raise ValueError(f"reset to adapter version {base.version} ({base.path!r}): a run starts at version 0")
        self._set_latest(base)
        deadline = time.monotonic() + wait_s
        while True:
            live = self.live_replicas()
            lagging = sorted(r for r in live if self._loaded[r] != (0, base.path))
            if not lagging:
                return live
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica(s) {lagging} do not sample with version 0 ({base.path!r}) {wait_s}s "
                                   f"after a reset (loaded: {sorted(self._loaded[r] for r in lagging)})")
            await asyncio.sleep(0.05)

    def _set_latest(self, ref: AdapterRef) -> None:
        self._latest = ref
        # Wake every waiter, then give later waiters a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_newer(self, replica_id: str, version: int, timeout_s: float, path: str = "",
                         node_id: str = "") -> AdapterRef | None:
        """Long poll: the newest ref once it differs from the replica's ``(version, path)``; None after
        ``timeout_s``. (It differs by being newer, or by a ``reset`` to a run's version 0.)"""
        self.heartbeat(replica_id, version, path, node_id)
        deadline = time.monotonic() + timeout_s
        while (self._latest.version, self._latest.path) == (version, path):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        return self._latest

    def heartbeat(self, replica_id: str, loaded_version: int, loaded_path: str = "", node_id: str = "") -> None:
        """A replica (on Ray node ``node_id``) is alive and samples with ``loaded_version`` (the adapter at
        ``loaded_path``)."""
        self._last_seen[replica_id] = time.monotonic()
        if node_id:
            self._nodes[replica_id] = node_id
        self._loaded[replica_id] = (loaded_version, loaded_path)
        if replica_id in self._failed and loaded_version >= self._failed[replica_id][0]:
            del self._failed[replica_id]

    def load_failed(self, replica_id: str, version: int, path: str, error: str) -> None:
        """A replica could not load the adapter ``version`` at ``path``: a publish waiting for it fails now, with
        ``error``, instead of timing out without a cause (the replica keeps retrying)."""
        self._failed[replica_id] = (version, path, error)

    def nodes(self) -> dict[str, str]:
        """``{replica_id: Ray node id}`` of the live replicas ("" when a replica did not say)."""
        return {r: self._nodes.get(r, "") for r in self.live_replicas()}

    def forget(self, replica_id: str) -> None:
        """A replica shut down cleanly; stop waiting for it."""
        self._nodes.pop(replica_id, None)
        self._last_seen.pop(replica_id, None)
        self._loaded.pop(replica_id, None)
        self._failed.pop(replica_id, None)

    def live_replicas(self) -> dict[str, int]:
        """``{replica_id: loaded version}`` of the replicas heard from within ``liveness_s``."""
        now = time.monotonic()
        return {r: self._loaded[r][0] for r, seen in self._last_seen.items() if now - seen < self._liveness_s}

    async def wait_loaded(self, version: int, timeout_s: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.live_replicas()
            lagging = sorted(r for r, v in live.items() if v < version)
            if not lagging:
                return live
            failed = {r: self._failed[r] for r in lagging if r in self._failed and self._failed[r][0] == version}
            if failed:
                _, path, error = failed[min(failed)]
                raise RuntimeError(f"adapter version {version} ({path!r}) failed to load on replica(s) "
                                   f"{sorted(failed)}: {error}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"adapter version {version} not loaded after {timeout_s}s by replica(s) {lagging} "
                    f"(loaded: {live})"
                )
            await asyncio.sleep(0.05)


def get_adapter_registry(app_name: str) -> ActorHandle:
    """The app's registry, created on first use (detached: it outlives whichever process created it)."""
    return AdapterRegistry.options(
        name=registry_name(app_name),
        namespace=REGISTRY_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
    ).remote()


def publish_adapter(app_name: str, ref: AdapterRef, wait_s: float = 120.0) -> dict[str, int]:
    """Blocking publish from a driver or trainer process: returns once every live replica loaded ``ref``."""
    return ray.get(get_adapter_registry(app_name).publish.remote(ref, wait_s))


def drop_adapter_registry(app_name: str, timeout_s: float = 30.0) -> bool:
    """Kill the app's registry once the app is gone, so a later app of that name starts at policy version 0.

    The registry is detached: without this, the next training run on a long-lived cluster (``ray start``
    + ``ray job submit``) would start its replicas on the previous run's adapter and have its first
    publish rejected as not newer. Returns whether there was one.
    """
    name = registry_name(app_name)
    try:
        ray.kill(ray.get_actor(name, namespace=REGISTRY_NAMESPACE), no_restart=True)
    except ValueError:  # no registry by that name
        return False
    deadline = time.monotonic() + timeout_s
    while True:  # the name is released asynchronously; get_if_exists must not find the dying actor
        try:
            ray.get_actor(name, namespace=REGISTRY_NAMESPACE)
        except ValueError:
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(f"adapter registry {name!r} still registered {timeout_s}s after it was killed")
        time.sleep(0.1)
