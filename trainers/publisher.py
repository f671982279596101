"""Adapter publishing (trainers layer).

The worker hands each new ``AdapterRef`` to a publisher: a Ray actor handle with ``publish(ref)`` or a
plain callable. ``AdapterLog`` records what was published; ``orchestration/`` later swaps in (or chains) a
publisher that loads the adapter on every rollout replica.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.records import AdapterRef


class AdapterLog:
    """Records published adapters in order; ``latest()`` is what a replica that joins now should load."""

    def __init__(self) -> None:
        self._refs: list[AdapterRef] = []

    def publish(self, ref: AdapterRef) -> None:
        if self._refs and ref.version <= self._refs[-1].version:
            # A retried step after a worker failure republishes its version: keep the newest path.
            self._refs = [r for r in self._refs if r.version < ref.version]
        # only the newest keeps its object-store copy: a replica that joins later loads the newest
        self._refs = [replace(r, files=None) for r in self._refs]
        self._refs.append(ref)

    def published(self) -> list[AdapterRef]:
        return list(self._refs)

    def latest(self) -> AdapterRef:
        return self._refs[-1] if self._refs else AdapterRef(version=0)


def shareable(ref: AdapterRef) -> AdapterRef:
    """``ref`` with its folder's files (``{name: bytes}``) put in the Ray object store and the node that wrote the
    folder named: replicas on other nodes load the copy (no shared filesystem needed), this node's read the folder."""
    import ray

    folder = Path(ref.path)
    files = ray.put({f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()})
    return replace(ref, files=files, node_id=ray.get_runtime_context().get_node_id())


def latest_published(publisher: Any) -> int:
    """The newest version the publisher has published (0 when it cannot say: a plain callable)."""
    remote = getattr(publisher, "latest", None)
    if remote is None or not hasattr(remote, "remote"):
        return 0
    import ray

    return ray.get(remote.remote()).version


def adapter_log_actor() -> Any:
    """An ``AdapterLog`` as a zero-CPU Ray actor, to hand the learner as its publisher when only a record is wanted."""
    import ray

    return ray.remote(num_cpus=0)(AdapterLog).remote()


def publish(publisher: Any, ref: AdapterRef) -> None:
    """Publish through an actor handle (waits until it is recorded) or call a plain callable."""
    if publisher is None:
        return
    remote = getattr(publisher, "publish", None)
    if remote is not None and hasattr(remote, "remote"):
        import ray

        ray.get(remote.remote(ref))
    else:
        publisher(ref)
