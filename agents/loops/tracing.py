"""The tracing protocol agent loops report to (agents layer: pure; the mlflow tracer lives in observability/tracing.py).

A loop asks for an episode span once; ``None`` means the episode is not traced (sampling cap, tracing
off) and every later call is skipped. Spans are opaque handles owned by the tracer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

SpanKind = Literal["AGENT", "LLM", "PARSER", "TOOL", "CHAIN"]


class Tracer(Protocol):
    """Span start/end, explicit parents (episodes interleave on one event loop, so no ambient context)."""

    token2text: bool
    """Whether the loop should add decoded text to span inputs/outputs."""

    def start_episode(self, name: str, inputs: Mapping[str, Any], tags: Mapping[str, str]) -> Any | None:
        """Root span of one episode, or None when this episode is not traced."""
        ...

    def start_span(self, parent: Any, name: str, kind: SpanKind, inputs: Mapping[str, Any]) -> Any: ...

    def end_span(self, span: Any, outputs: Any = None, error: str | None = None) -> None: ...

    def flush(self) -> None:
        """Block until every ended span is stored (exporters may write asynchronously)."""
        ...


class NullTracer:
    """Traces nothing."""

    token2text = False

    def start_episode(self, name: str, inputs: Mapping[str, Any], tags: Mapping[str, str]) -> None:
        return None

    def start_span(self, parent: Any, name: str, kind: SpanKind, inputs: Mapping[str, Any]) -> None:
        return None

    def end_span(self, span: Any, outputs: Any = None, error: str | None = None) -> None:
        return None

    def flush(self) -> None:
        return None


class EpisodeSpans:
    """The spans of one episode; a no-op when the tracer declined the episode."""

    def __init__(self, tracer: Tracer, root: Any | None):
        self.tracer = tracer
        self.root = root

    @property
    def active(self) -> bool:
        return self.root is not None

    @property
    def token2text(self) -> bool:
        return self.active and self.tracer.token2text

    def start(self, name: str, kind: SpanKind, inputs: Mapping[str, Any]) -> Any | None:
        if self.root is None:
            return None
        return self.tracer.start_span(self.root, name, kind, inputs)

    def end(self, span: Any | None, outputs: Any = None, error: str | None = None) -> None:
        if span is not None:
            self.tracer.end_span(span, outputs, error)

    def finish(self, outputs: Any = None, error: str | None = None) -> None:
        if self.root is not None:
            self.tracer.end_span(self.root, outputs, error)
            self.root = None
