"""Training samples from the LLM calls an OpenAI-speaking agent made (agents layer: pure).

The rollout app's OpenAI ingress records every chat completion of a session token-exactly
(``prompt_ids``, ``response_ids``, log-probs, policy version). An agent framework re-renders the whole
conversation for each call, so call ``k+1``'s prompt usually *extends* call ``k``'s prompt + response
token for token (the extension being the end of turn and the tool messages). Such calls merge into one
sample: the extension gets mask 0, each response mask 1. When a prompt does not extend the previous
one (the framework rewrote history, or the template re-tokenized the model's text differently), a new
sample starts: merging across a mismatch would train on tokens the policy never saw in that context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


def agl_session_id(rollout_id: str, attempt_id: str) -> str:
    """The session under which the ingress records the calls of one Agent Lightning 0.3.x rollout attempt (its
    ``ProxyLLM`` base URL ``/rollout/{rollout_id}/attempt/{attempt_id}/v1``)."""
    return f"agl:{rollout_id}:{attempt_id}"


@dataclass(frozen=True)
class SessionCall:
    """One recorded LLM call of a session (the JSON the ingress returns, typed)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int
    finish_reason: str

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], where: str = "session call") -> SessionCall:
        try:
            call = cls(
                prompt_ids=tuple(int(t) for t in raw["prompt_ids"]),
                response_ids=tuple(int(t) for t in raw["response_ids"]),
                logprobs=tuple(float(x) for x in raw["logprobs"]),
                policy_version=int(raw["policy_version"]),
                finish_reason=str(raw["finish_reason"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: malformed recorded call ({type(exc).__name__}: {exc})") from None
        if len(call.response_ids) != len(call.logprobs):
            raise ValueError(f"{where}: {len(call.response_ids)} response ids but {len(call.logprobs)} logprobs")
        return call


@dataclass
class MergedSample:
    """Consecutive calls merged into one token-exact sample."""

    prompt_ids: tuple[int, ...]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_version: int = 0
    num_calls: int = 0
    last_finish_reason: str = "stop"

    def append_call(self, call: SessionCall, extension: Sequence[int]) -> None:
        self.response_ids.extend(extension)
        self.response_mask.extend([0] * len(extension))
        self.logprobs.extend([0.0] * len(extension))
        self.response_ids.extend(call.response_ids)
        self.response_mask.extend([1] * len(call.response_ids))
        self.logprobs.extend(call.logprobs)
        self.policy_version = call.policy_version if self.num_calls == 0 else min(self.policy_version,
                                                                                  call.policy_version)
        self.num_calls += 1
        self.last_finish_reason = call.finish_reason

    @property
    def full_ids(self) -> tuple[int, ...]:
        return (*self.prompt_ids, *self.response_ids)


def merge_session_calls(calls: Sequence[SessionCall]) -> list[MergedSample]:
    """One sample per run of calls whose prompts each extend the previous prompt + response."""
    samples: list[MergedSample] = []
    for call in calls:
        current = samples[-1] if samples else None
        if current is not None:
            sofar = current.full_ids
            if len(call.prompt_ids) >= len(sofar) and call.prompt_ids[: len(sofar)] == sofar:
                current.append_call(call, call.prompt_ids[len(sofar):])
                continue
        sample = MergedSample(prompt_ids=call.prompt_ids)
        sample.append_call(call, ())
        samples.append(sample)
    return samples
