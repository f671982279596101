"""A tool class written for verl (a ``verl.tools.base_tool.BaseTool`` subclass), run unchanged (agents layer).

``VerlTool`` wraps one instance of the user's class and drives it the way verl's agent loops do: per trajectory
``create`` (with the row's ``tools_kwargs.<name>.create_kwargs``, passed both as keywords and as
``create_kwargs=``, the two ways verl's tools read them) returning verl's ``(instance_id, ToolResponse)``;
``execute(instance_id, parameters)`` returning ``(ToolResponse, step reward, metrics)``, whose text is what the
model sees; ``calc_reward``; ``release``. The step rewards and metrics a call returns are kept per trajectory
(``step_rewards``, ``metrics``). Importing verl happens only when a config names such a class.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from agents.tools.base import Tool


def is_verl_tool_class(cls: Any) -> bool:
    """Whether ``cls`` subclasses verl's ``BaseTool`` (False when verl is not installed)."""
    try:
        from verl.tools.base_tool import BaseTool
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, BaseTool)


class VerlTool(Tool):
    """Our ``Tool`` interface over an instance of a verl ``BaseTool`` subclass."""

    def __init__(self, verl_cls: type, config: dict[str, Any] | None = None,
                 tool_schema: dict[str, Any] | None = None, *, where: str = "tool"):
        from verl.tools.base_tool import BaseTool
        from verl.tools.schemas import OpenAIFunctionToolSchema

        if tool_schema is None:
            raise ValueError(f"{where}: {verl_cls.__module__}.{verl_cls.__qualname__} is a verl BaseTool; verl tools "
                             "take their schema from the config: add a tool_schema")
        with contextlib.redirect_stdout(io.StringIO()):  # BaseTool.__init__ prints the whole schema
            self.inner = verl_cls(config=dict(config or {}), tool_schema=OpenAIFunctionToolSchema.model_validate(tool_schema))
        self._scores = type(self.inner).calc_reward is not BaseTool.calc_reward
        self._instances: dict[str, str] = {}  # our trajectory id -> the tool's instance id
        self.step_rewards: dict[str, list[float]] = {}
        self.metrics: dict[str, list[dict[str, Any]]] = {}
        super().__init__(config, tool_schema)

    @classmethod
    def default_schema(cls) -> dict[str, Any]:  # never used: a verl tool always has a schema
        raise NotImplementedError

    @property
    def scores_episodes(self) -> bool:
        """The user's class implements ``calc_reward`` (then it scores the episodes whose rows configure it)."""
        return self._scores

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        created = await self.inner.create(instance_id, create_kwargs=dict(create_kwargs), **create_kwargs)
        self._instances[instance_id] = created[0] if isinstance(created, tuple) else (created or instance_id)
        self.step_rewards[instance_id], self.metrics[instance_id] = [], []

    def _instance(self, instance_id: str) -> str:
        return self._instances.get(instance_id, instance_id)

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        response, reward, metrics = await self.inner.execute(self._instance(instance_id), arguments)
        if reward is not None:
            self.step_rewards.setdefault(instance_id, []).append(float(reward))
        self.metrics.setdefault(instance_id, []).append(dict(metrics or {}))
        return getattr(response, "text", None) or ""

    async def calc_reward(self, instance_id: str) -> float:
        return float(await self.inner.calc_reward(self._instance(instance_id)))

    async def release(self, instance_id: str) -> None:
        try:
            await self.inner.release(self._instance(instance_id))
        finally:
            self._instances.pop(instance_id, None)
            self.step_rewards.pop(instance_id, None)
            self.metrics.pop(instance_id, None)
