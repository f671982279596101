"""Tool interface (agents layer: pure asyncio, no ray).

Shaped like verl's ``BaseTool`` (create / execute / calc_reward / release) so verl tool configs map
one to one, but typed: a tool keeps per-episode state keyed by ``instance_id`` and ``execute``
returns the text the model sees. A tool signals a user-visible failure by raising ``ToolError``;
the agent loop turns any exception or timeout into an error tool message (a fault boundary).
"""

from __future__ import annotations

import abc
from typing import Any


class ToolError(Exception):
    """A failure the model should see as the tool's answer (bad arguments, SQL error, ...)."""


class Tool(abc.ABC):
    """One tool. ``schema`` is the OpenAI function schema rendered into the chat template."""

    name: str

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        self.config = dict(config or {})
        self.schema = tool_schema or self.default_schema()
        self.name = self.schema["function"]["name"]

    @classmethod
    @abc.abstractmethod
    def default_schema(cls) -> dict[str, Any]:
        """The OpenAI-style schema used when the tool config gives none."""

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        """Start per-episode state (``create_kwargs`` come from the row's ``tools_kwargs``)."""

    def assets(self, create_kwargs: dict[str, Any]) -> list[str]:
        """Files an episode created with ``create_kwargs`` reads (a database, a corpus): checked on every node
        that runs agent workers before a run starts, so a missing one fails there and names the node."""
        return []

    @abc.abstractmethod
    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        """Run one call and return the tool message content; raise ``ToolError`` on bad input."""

    async def calc_reward(self, instance_id: str) -> float:
        """A tool-derived reward for the episode (0.0 for tools without one)."""
        return 0.0

    async def release(self, instance_id: str) -> None:
        """Drop per-episode state."""
