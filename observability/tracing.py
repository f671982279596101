"""mlflow tracing of agent loops (observability layer: the only place that imports mlflow for traces).

``MlflowTracer`` implements ``agents.loops.tracing.Tracer``: one root span ``agent_loop`` per traced
episode (span type AGENT, tagged with step, sample index, agent name, run id, trajectory and group id),
child spans for each generate (LLM), parse (PARSER) and tool call (TOOL). At most
``trace.max_samples_per_step`` episodes of each training step are traced, the first ones to start.

Spans are opened with ``mlflow.start_span_no_context`` and explicit parents: many episodes interleave on
one event loop, so there is no ambient "current span". mlflow exports traces asynchronously; call
``flush()`` (``mlflow.flush_trace_async_logging``) before reading them back with ``mlflow.search_traces``.

Agent workers get a picklable factory (``tracer_factory(cfg)``) and build the tracer in their own process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import mlflow
from mlflow.entities import SpanStatusCode

from agents.loops.tracing import NullTracer, SpanKind, Tracer

DEFAULT_EXPERIMENT = "tandem-agent-loops"


class MlflowTracer:
    """Agent-loop spans in an mlflow tracking store (``sqlite:///mlruns.db`` by default)."""

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiment_name: str = DEFAULT_EXPERIMENT,
        token2text: bool = False,
        max_samples_per_step: int = 8,
    ):
        mlflow.set_tracking_uri(tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment_id = mlflow.set_experiment(experiment_name).experiment_id
        self.token2text = token2text
        self.max_samples_per_step = max_samples_per_step
        self._traced_per_step: dict[str, int] = {}
        self._lock = threading.Lock()  # episodes of a worker share one event loop, but be safe anyway

    def _admit(self, step: str) -> bool:
        with self._lock:
            count = self._traced_per_step.get(step, 0)
            if count >= self.max_samples_per_step:
                return False
            self._traced_per_step[step] = count + 1
            return True

    def start_episode(self, name: str, inputs: Mapping[str, Any], tags: Mapping[str, str]) -> Any | None:
        if not self._admit(str(tags.get("step", "0"))):
            return None
        return mlflow.start_span_no_context(
            name,
            span_type="AGENT",
            inputs=dict(inputs),
            attributes=dict(tags),
            tags=dict(tags),
            experiment_id=self.experiment_id,
        )

    def start_span(self, parent: Any, name: str, kind: SpanKind, inputs: Mapping[str, Any]) -> Any:
        return mlflow.start_span_no_context(name, span_type=kind, parent_span=parent, inputs=dict(inputs))

    def end_span(self, span: Any, outputs: Any = None, error: str | None = None) -> None:
        if error is not None:
            span.end(outputs=outputs, attributes={"error": error}, status=SpanStatusCode.ERROR)
        else:
            span.end(outputs=outputs, status=SpanStatusCode.OK)

    def flush(self) -> None:
        """Wait until every ended trace is written (they are exported asynchronously)."""
        mlflow.flush_trace_async_logging()


def make_tracer(
    backend: str, tracking_uri: str, *, token2text: bool, max_samples_per_step: int,
    experiment_name: str = DEFAULT_EXPERIMENT,
) -> Tracer:
    """The tracer for ``trace.backend`` (``none`` or a zero sampling cap -> ``NullTracer``)."""
    if backend == "none" or max_samples_per_step == 0:
        return NullTracer()
    if backend != "mlflow":
        raise ValueError(f"unknown trace backend {backend!r}; expected mlflow or none")
    return MlflowTracer(tracking_uri, experiment_name=experiment_name, token2text=token2text,
                        max_samples_per_step=max_samples_per_step)


def tracer_factory(cfg: Any, experiment_name: str = DEFAULT_EXPERIMENT) -> Callable[[], Tracer]:
    """A picklable factory for agent workers, from ``actor_rollout_ref.rollout.trace`` and ``tracking``."""
    trace = cfg.actor_rollout_ref.rollout.trace
    return partial(
        make_tracer, trace.backend, cfg.tracking.mlflow_tracking_uri, token2text=trace.token2text,
        max_samples_per_step=trace.max_samples_per_step, experiment_name=experiment_name,
    )
