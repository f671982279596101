"""Ray metrics of the rollout servers (deployments layer: observability at the edge).

One ``RolloutMetrics`` per ``RolloutServer``; every series is tagged with the replica id so the
dashboard (or Prometheus) can tell replicas apart. Outside a Ray worker (a plain ``RolloutServer``
in a unit test) the metrics are no-ops: Ray's metric objects need a connected worker.
"""

from __future__ import annotations

import ray
from ray.util import metrics

# Seconds; a CPU tiny-model request takes ~0.05-2 s, a GPU 7B one ~0.5-60 s.
LATENCY_BOUNDARIES_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]


class RolloutMetrics:
    """Generated tokens (Counter), in-flight requests and adapter version (Gauges), latency (Histogram)."""

    def __init__(self, replica_id: str) -> None:
        self._enabled = ray.is_initialized()
        if not self._enabled:
            return
        tags = {"replica": replica_id}
        self._tokens = metrics.Counter(
            "tandem_rollout_generated_tokens",
            description="Tokens sampled by this rollout replica.",
            tag_keys=("replica",),
        ).set_default_tags(tags)
        self._in_flight = metrics.Gauge(
            "tandem_rollout_in_flight_requests",
            description="Generate requests running on this rollout replica.",
            tag_keys=("replica",),
        ).set_default_tags(tags)
        self._latency = metrics.Histogram(
            "tandem_rollout_generate_latency_s",
            description="Wall-clock seconds of one generate call.",
            boundaries=LATENCY_BOUNDARIES_S,
            tag_keys=("replica",),
        ).set_default_tags(tags)
        self._adapter_version = metrics.Gauge(
            "tandem_rollout_adapter_version",
            description="Policy version (LoRA adapter) this rollout replica samples with.",
            tag_keys=("replica",),
        ).set_default_tags(tags)

    def record_generate(self, num_tokens: int, latency_s: float) -> None:
        if self._enabled:
            if num_tokens > 0:  # Ray's Counter rejects increments <= 0
                self._tokens.inc(num_tokens)
            self._latency.observe(latency_s)

    def set_in_flight(self, count: int) -> None:
        if self._enabled:
            self._in_flight.set(count)

    def set_adapter_version(self, version: int) -> None:
        if self._enabled:
            self._adapter_version.set(version)
