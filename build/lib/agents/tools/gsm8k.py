"""The ``calc_gsm8k_reward`` tool, shaped like verl's ``Gsm8kTool`` (agents layer: pure).

The model proposes an answer; the tool scores it against the row's ground truth with the GSM8K reward
and replies ``Current parsed answer='72' reward=1.0``, so the model can revise. ``calc_reward`` is the
score of the last proposal. Ground truth arrives per episode through ``create(ground_truth=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.rewards import gsm8k as gsm8k_reward
from agents.tools.base import Tool, ToolError


@dataclass
class _Episode:
    ground_truth: str
    answer: str = ""
    reward: float = 0.0


def normalize_answer(answer: Any) -> str:
    """Numbers as plain digits (72.0 -> '72'); text without thousands separators, '$' or a final '.'
    (verl's flexible parser would keep the sentence's full stop: '72.' != '72')."""
    if isinstance(answer, bool):
        raise ToolError("answer must be a number or a string, got a boolean")
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    if isinstance(answer, (int, float)):
        return str(answer)
    if not isinstance(answer, str):
        raise ToolError(f"answer must be a number or a string, got {type(answer).__name__}")
    return answer.strip().replace(",", "").replace("$", "").rstrip(".")


class Gsm8kTool(Tool):
    """Per-episode ground truth and last proposed answer, keyed by ``instance_id``."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        super().__init__(config, tool_schema)
        self._episodes: dict[str, _Episode] = {}

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "calc_gsm8k_reward",
                "description": "Check a final answer to the math problem: replies with the parsed answer "
                "and its reward (1.0 correct, 0.0 otherwise).",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "answer": {"type": "string", "description": "The final numeric answer, digits only."}
                    },
                    "required": ["answer"],
                },
            },
        }

    async def create(self, instance_id: str, ground_truth: Any = None, **create_kwargs: Any) -> None:
        if create_kwargs:
            raise ValueError(
                f"tool {self.name} instance {instance_id}: unknown create_kwargs {sorted(create_kwargs)}"
            )
        if ground_truth is None:
            raise ValueError(f"tool {self.name} instance {instance_id}: create needs ground_truth")
        self._episodes[instance_id] = _Episode(gsm8k_reward.normalize_ground_truth(ground_truth))

    def _episode(self, instance_id: str) -> _Episode:
        if instance_id not in self._episodes:
            raise KeyError(f"tool {self.name}: no episode {instance_id!r} (create was not called)")
        return self._episodes[instance_id]

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        episode = self._episode(instance_id)
        if "answer" not in arguments:
            raise ToolError(f"{self.name}: missing argument 'answer'")
        answer = normalize_answer(arguments["answer"])
        proposal = answer if answer.startswith("####") else f"#### {answer}"
        # flexible: take the last number in the proposal, as verl's tool does.
        episode.reward = gsm8k_reward.score(proposal, episode.ground_truth, method="flexible")
        episode.answer = answer
        return f"Current parsed answer={answer!r} reward={episode.reward}"

    async def calc_reward(self, instance_id: str) -> float:
        return self._episode(instance_id).reward

    async def release(self, instance_id: str) -> None:
        self._episodes.pop(instance_id, None)
