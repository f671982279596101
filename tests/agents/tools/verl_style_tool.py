"""A tool written the way verl's docs write one (``BaseTool`` with per-instance state, ``create_kwargs`` from the
row's ``tools_kwargs``, ``execute`` returning ``(ToolResponse, step reward, metrics)``). Not ours: only verl's API."""

from __future__ import annotations

from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class AnswerCheckTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
        super().__init__(config, tool_schema)
        self._instance_dict: dict[str, dict[str, Any]] = {}
        self.penalty = float(config.get("penalty", 0.05))

    async def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None,
                     **kwargs) -> tuple[str, ToolResponse]:
        if instance_id is None:
            instance_id = str(uuid4())
        create_kwargs = kwargs.get("create_kwargs", {})
        if create_kwargs:
            ground_truth = create_kwargs.get("ground_truth", ground_truth)
        self._instance_dict[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        answer = str(parameters.get("answer", ""))
        state = self._instance_dict[instance_id]
        state["response"] = answer
        reward = 1.0 if answer.strip() == str(state["ground_truth"]) else 0.0
        tool_reward = 0.0 if reward > state["reward"] else -self.penalty
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed answer={answer!r} result={reward}"), tool_reward, {"checked": 1}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return self._instance_dict[instance_id]["reward"]

    async def release(self, instance_id: str, **kwargs) -> None:
        del self._instance_dict[instance_id]
