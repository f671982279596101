"""Prompt length limit with verl's ``data.truncation`` semantics (agents layer: pure).

``error`` refuses an over-long prompt; ``left`` drops tokens from the start (keeps the end), ``right``
drops them from the end (keeps the start), ``middle`` keeps the first ``max // 2`` and the last
``max - max // 2`` tokens, as verl's ``RLHFDataset`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

Truncation = Literal["error", "left", "right", "middle"]


class PromptTooLongError(ValueError):
    """A prompt over ``max_prompt_length`` with ``truncation: error``; names the row."""


def _keep_end(ids: Sequence[int], limit: int) -> list[int]:
    return list(ids[len(ids) - limit :])


def _keep_start(ids: Sequence[int], limit: int) -> list[int]:
    return list(ids[:limit])


def _keep_both_ends(ids: Sequence[int], limit: int) -> list[int]:
    head = limit // 2
    tail = limit - head
    return list(ids[:head]) + list(ids[len(ids) - tail :])


_TRUNCATE: dict[str, Callable[[Sequence[int], int], list[int]]] = {
    "left": _keep_end,
    "right": _keep_start,
    "middle": _keep_both_ends,
}


def apply_prompt_limit(
    prompt_ids: Sequence[int], max_prompt_length: int, truncation: Truncation, row_index: int
) -> list[int]:
    """Return ``prompt_ids`` cut to ``max_prompt_length`` tokens, or raise for ``truncation="error"``."""
    if max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
    if truncation != "error" and truncation not in _TRUNCATE:
        raise ValueError(f"truncation must be one of error|left|right|middle, got {truncation!r}")
    if len(prompt_ids) <= max_prompt_length:
        return list(prompt_ids)
    if truncation == "error":
        raise PromptTooLongError(
            f"row {row_index}: prompt has {len(prompt_ids)} tokens, max_prompt_length is {max_prompt_length}"
        )
    return _TRUNCATE[truncation](prompt_ids, max_prompt_length)
