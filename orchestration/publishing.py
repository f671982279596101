"""The driver's two channels: the publisher that carries each adapter to the rollout replicas and tells the
coordinator, and the metrics sink the learner and the publisher push to and the driver takes from."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from agents.records import AdapterRef
from orchestration.cluster import keep_copy

log = logging.getLogger("tandem_rl.publishing")


@dataclass
class Reports:
    """What reached the metrics sink since the last ``take``: learner metrics per step, replica version
    switches (publishes, and replicas that joined), validation results."""

    learner: list[dict[str, float]] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)
    validations: list[Any] = field(default_factory=list)


class MetricsSink:
    """The metrics channel: the learner (rank 0) and the publisher push here, the driver takes."""

    def __init__(self) -> None:
        self._pending = Reports()

    def learner(self, metrics: dict[str, float]) -> None:
        self._pending.learner.append(dict(metrics))

    def switch(self, entry: dict[str, Any]) -> None:
        self._pending.switches.append(entry)

    def validation(self, result: Any) -> None:
        self._pending.validations.append(result)

    def take(self) -> Reports:
        out, self._pending = self._pending, Reports()
        return out


MetricsSinkActor = ray.remote(num_cpus=0)(MetricsSink)


class AdapterPublisher:
    """The trainer's publisher: each new adapter goes to every rollout replica, then the coordinator hears of it.

    ``publish`` returns once all live replicas sample with the new version, and the coordinator's admission moves
    with the push, so no group starts on an adapter that is not loaded yet. Replicas that autoscaling adds
    between publishes load the newest adapter on their own; the app's registry hears from them and
    ``report_joined`` reports each one once to the sink (``joined: True``).

    With a ``validator``, a publish of a version the schedule names (every ``test_freq`` steps and the last step,
    as verl) validates before it returns: the learner waits, so every validation episode samples exactly that
    version, while agent workers go on generating training groups with it. ``validate_start`` validates version 0
    the same way while the learner starts up; the first publish waits for it.
    """

    def __init__(self, app_name: str, coordinator: Any, sink: Any, wait_s: float = 300.0, *, validator: Any = None,
                 test_freq: int = -1, total_steps: int | None = None, validate_before_train: bool = False):
        from deployments.rollout_app import publish_adapter

        self._publish = publish_adapter
        self._registry_handle: Any = None  # the app's registry, looked up on first use (the app may deploy later)
        self._reported: set[str] = set()  # replicas a reported switch already named
        self.app_name = app_name
        self.coordinator = coordinator
        self.sink = sink
        self.wait_s = wait_s
        self.validator = validator
        self.test_freq = test_freq
        self.total_steps = total_steps
        # Without a coordinator yet (the learner starts while the rollout app deploys), publish and latest wait for
        # attach(); with validate_before_train, publishing then waits until validate_start has validated version 0,
        # whichever call reaches this (threaded) actor first.
        self._attached = threading.Event()
        if coordinator is not None:
            self._attached.set()
        self._start_validated = threading.Event()
        if not validate_before_train:
            self._start_validated.set()

    def attach(self, coordinator: Any, validator: Any = None) -> None:
        """The rollout app is deployed and the coordinator exists: publishes may go ahead. The learner starts before
        (its workers' start-up overlaps the app's deploy) and waits here on its first ``latest`` or ``publish``."""
        self.coordinator = coordinator
        self.validator = validator
        self._attached.set()

    @property
    def _registry(self) -> Any:
        if self._registry_handle is None:
            from deployments.adapter_registry import get_adapter_registry

            self._registry_handle = get_adapter_registry(self.app_name)
        return self._registry_handle

    def validate_start(self) -> None:
        """Validate policy version 0 while the learner starts and the first groups generate; the first publish
        waits for it, so every validation episode samples version 0."""
        try:
            ray.get(self.sink.validation.remote(self.validator.run(0)))
        finally:
            self._start_validated.set()

    def validates_at(self, step: int) -> bool:
        return self.validator is not None and self.test_freq > 0 and (
            step % self.test_freq == 0 or step == self.total_steps)

    def latest(self) -> AdapterRef:
        """The newest adapter the replicas were told to load (a restarted learner publishes past it)."""
        self._attached.wait()
        return ray.get(self._registry.latest.remote())

    def publish(self, ref: AdapterRef) -> dict[str, int]:
        self._attached.wait()
        self._start_validated.wait()
        started = time.perf_counter()
        loaded = self._publish(self.app_name, ref, self.wait_s)
        elapsed = time.perf_counter() - started
        nodes = ray.get(self._registry.nodes.remote())
        for replica, version in sorted(loaded.items()):
            log.info("replica %s switched to policy version %d (%.2fs after publish)", replica, version, elapsed)
        self._reported.update(loaded)
        switch = {"version": ref.version, "replicas": loaded, "sync_s": elapsed, "joined": False, "nodes": nodes}
        ray.get(self.sink.switch.remote(switch))
        ray.get(self.coordinator.on_publish.remote(ref.version))
        keep_copy(ref)
        step = ref.version if ref.step is None else ref.step
        if step > 0 and self.validates_at(step):  # scheduled by training step (a restarted learner repeats some)
            ray.get(self.sink.validation.remote(self.validator.run(step)))
        return loaded

    def report_joined(self) -> None:
        """Tell the sink about live replicas no reported switch has named yet."""
        live = ray.get(self._registry.live_replicas.remote())
        joined = {replica: version for replica, version in live.items() if replica not in self._reported}
        self._reported.update(joined)
        if joined:
            nodes = ray.get(self._registry.nodes.remote())
            ray.get(self.sink.switch.remote({"version": max(joined.values()), "replicas": joined, "sync_s": None,
                                             "joined": True, "nodes": nodes}))


AdapterPublisherActor = ray.remote(num_cpus=0, max_concurrency=8)(AdapterPublisher)
"""Started on the driver's node (``orchestration.cluster.on_this_node``): adapters a learner on another node wrote are
copied here (``keep_copy``)."""
