"""Episode inputs and limits: what one agent-loop run is given (agents layer: pure).

``episodes_for_row`` turns a dataset row into its ``n`` episodes (one group); ``LoopLimits`` gathers the
limits of ``multi_turn``, ``data.max_response_length`` and ``max_model_len``; ``row_reward`` scores a
final answer with the row's rule reward.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agents.chat import Message
from agents.data.rows import DatasetRow
from agents.loops.tool_calls import TruncateSide
from agents.records import SamplingParams
from agents.rewards import score_reward


@dataclass(frozen=True)
class LoopLimits:
    """The limits of one episode (``multi_turn`` + ``data.max_response_length`` + ``max_model_len``)."""

    max_response_length: int
    max_model_len: int
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: TruncateSide = "middle"
    on_parse_error: str = "feedback"
    tool_timeout_s: float = 10.0
    max_prompt_length: int | None = None  # data.max_prompt_length, applied with data.truncation to the rendered prompt
    truncation: str = "error"

    @classmethod
    def from_config(cls, cfg: Any) -> LoopLimits:
        """From a ``TandemConfig``: only the keys listed above are read."""
        mt = cfg.actor_rollout_ref.rollout.multi_turn
        return cls(
            max_response_length=cfg.data.max_response_length,
            max_model_len=cfg.max_model_len,
            max_assistant_turns=mt.max_assistant_turns,
            max_user_turns=mt.max_user_turns,
            max_parallel_calls=mt.max_parallel_calls,
            max_tool_response_length=mt.max_tool_response_length,
            tool_response_truncate_side=mt.tool_response_truncate_side,
            on_parse_error=mt.on_parse_error,
            tool_timeout_s=mt.tool_timeout_s,
            max_prompt_length=cfg.data.max_prompt_length,
            truncation=cfg.data.truncation,
        )


@dataclass(frozen=True)
class Episode:
    """One sample of one row: what the loop needs, nothing Ray- or parquet-specific."""

    trajectory_id: str
    group_id: str
    messages: tuple[Message, ...]
    agent_name: str
    data_source: str
    ground_truth: Any
    sampling: SamplingParams
    extra_info: Mapping[str, Any] = field(default_factory=dict)
    tools_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    step: int = 0
    sample_index: int = 0
    validation: bool = False
    """A validation episode (nothing of it is trained on)."""


def sample_seed(group_id: str, sample_index: int) -> int:
    """A stable per-sample seed (same row, step and index -> same seed in every run)."""
    return zlib.crc32(f"{group_id}/{sample_index}".encode()) & 0x7FFFFFFF


def episodes_for_row(
    row: DatasetRow,
    n: int,
    sampling: SamplingParams,
    *,
    group_id: str,
    step: int = 0,
    default_agent_loop: str = "single_turn_agent",
    validation: bool = False,
) -> list[Episode]:
    """The ``n`` episodes of one row: one ``group_id``, own ``trajectory_id`` and seed each.

    A row that does not set ``agent_name`` runs ``default_agent_loop``.
    """
    agent_name = row.agent_name if "agent_name" in row.model_fields_set else default_agent_loop
    extra = row.extra_info.model_dump()
    messages = tuple(row.messages())
    return [
        Episode(
            trajectory_id=f"{group_id}-{i}",
            group_id=group_id,
            messages=messages,
            agent_name=agent_name,
            data_source=row.data_source,
            ground_truth=row.reward_model.ground_truth,
            sampling=replace(sampling, seed=sample_seed(group_id, i)),
            extra_info=extra,
            tools_kwargs=dict(row.extra_info.tools_kwargs),
            step=step,
            sample_index=i,
            validation=validation,
        )
        for i in range(n)
    ]


RewardFn = Callable[[Episode, str], "float | Mapping[str, Any]"]
"""A number or verl's dict (``{"score": …, "acc": …}``); the loop turns either into a ``RewardScore``."""


def custom_reward(call: Callable[..., Any]) -> RewardFn:
    """A ``RewardFn`` over a user's verl-style reward function (``agents.rewards.load_custom_reward``)."""
    def reward(episode: Episode, solution: str) -> Any:
        return call(data_source=episode.data_source, solution_str=solution, ground_truth=episode.ground_truth,
                    extra_info=dict(episode.extra_info))
    return reward


def row_reward(episode: Episode, solution: str) -> Mapping[str, float]:
    """The row's rule reward (``agents.rewards``, chosen by ``data_source``) as verl's dict."""
    scored = score_reward(episode.data_source, solution, episode.ground_truth, episode.extra_info)
    return {"score": scored.score, **scored.extra}
