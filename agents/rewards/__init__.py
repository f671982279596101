"""Rewards as pure functions of (solution, ground truth, row extras) (agents layer).

``REWARDS`` maps a ``data_source`` prefix to a scorer; ``reward_fn`` picks the longest prefix that
matches a row's ``data_source`` and ``score_reward`` calls it with the row's ``extra_info`` keys
that the scorer declares (``db_path`` for SQL); other bookkeeping keys (``split``, ``index``) are left out.

A scorer returns a number or, as verl's reward functions may, a dict with ``score`` and further numeric keys
(``acc``, ...): ``RewardScore`` holds both, the extra keys travel on the trajectory (``reward_extra``) into
training metrics (``reward/<key>``) and validation metrics (``val-core/<data_source>/acc/mean@N``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agents.data import arithmetic
from agents.rewards import gsm8k, sql

RewardFn = Callable[..., "float | Mapping[str, Any]"]


@dataclass(frozen=True)
class RewardScore:
    """One episode's reward: ``score`` is what GRPO trains on; ``extra`` the scorer's other numbers (verl's
    ``reward_extra_info``, e.g. ``acc``)."""

    score: float
    extra: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any, where: str) -> RewardScore:
        """From a scorer's return value: a number, or verl's dict ``{"score": …, <key>: <number>, …}``."""
        if isinstance(value, Mapping):
            if "score" not in value:
                raise ValueError(f"{where}: the reward dict has no 'score' key (keys: {sorted(value)})")
            extra = {str(k): _number(v, f"{where}: reward key {k!r}") for k, v in value.items() if k != "score"}
            return cls(_number(value["score"], f"{where}: reward key 'score'"), extra)
        return cls(_number(value, f"{where}: reward"))


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


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


def score_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> RewardScore:
    """Score one response with the scorer for its ``data_source``."""
    fn = reward_fn(data_source)
    accepted = {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    kwargs = {k: v for k, v in (extra_info or {}).items() if k in accepted}
    return RewardScore.of(fn(solution_str, ground_truth, **kwargs), f"reward for data_source {data_source!r}")


def load_custom_reward(path: str, name: str = "compute_score",
                       reward_kwargs: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """A user's reward function from a Python file, called as verl calls it: ``fn(data_source=…,
    solution_str=…, ground_truth=…, extra_info=…, **reward_kwargs)``. Errors name the file and function."""
    import importlib.util
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"custom_reward_function.path: no file {file}")
    spec = importlib.util.spec_from_file_location(f"tandem_custom_reward_{abs(hash(str(file.resolve())))}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RuntimeError(f"custom_reward_function.path {file}: importing it failed: {exc!r}") from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AttributeError(f"custom_reward_function: {file} has no function {name!r}")
    kwargs = dict(reward_kwargs or {})
    if inspect.iscoroutinefunction(fn):
        async def call_async(**arguments: Any) -> Any:
            return await fn(**arguments, **kwargs)
        return call_async

    def call(**arguments: Any) -> Any:
        return fn(**arguments, **kwargs)
    return call


def compute_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float:
    """The ``score`` of ``score_reward``."""
    return score_reward(data_source, solution_str, ground_truth, extra_info).score
