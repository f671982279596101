"""Rewards as pure functions of (solution, ground truth, row extras) (agents layer).

``REWARDS`` maps a ``data_source`` prefix to a scorer; ``reward_fn`` picks the longest prefix that
matches a row's ``data_source`` and ``compute_reward`` calls it with the row's ``extra_info`` keys
that the scorer declares (``db_path`` for SQL); other bookkeeping keys (``split``, ``index``) are left out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agents.data import arithmetic
from agents.rewards import gsm8k, sql

RewardFn = Callable[..., float]

REWARDS: dict[str, RewardFn] = {
    "openai/gsm8k": gsm8k.score,
    "gsm8k": gsm8k.score,
    "reasoning_gym/": gsm8k.score,  # GSM-style generators; bare-number ground truth, '#### N' answers
    "tandem/arithmetic": arithmetic.score_answer,
    "sql/": sql.score,  # agents.data.sql_tasks writes sql/<db_id>
    "spider": sql.score,
    "bird": sql.score,
    "chinook": sql.score,
}


def reward_fn(data_source: str) -> RewardFn:
    """The scorer for ``data_source`` (longest matching prefix); KeyError names the known prefixes."""
    matches = [prefix for prefix in REWARDS if data_source.startswith(prefix)]
    if not matches:
        raise KeyError(f"no reward for data_source {data_source!r}; known prefixes: {sorted(REWARDS)}")
    return REWARDS[max(matches, key=len)]


def compute_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """Score one response with the scorer for its ``data_source``."""
    fn = reward_fn(data_source)
    accepted = {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    kwargs = {k: v for k, v in (extra_info or {}).items() if k in accepted}
    return float(fn(solution_str, ground_truth, **kwargs))
