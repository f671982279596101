"""Merging recorded OpenAI-ingress calls into token-exact samples."""

from __future__ import annotations

import pytest

from agents.loops.session_merge import SessionCall, merge_session_calls


def call(prompt: list[int], response: list[int], version: int = 0, finish: str = "stop") -> SessionCall:
    return SessionCall(tuple(prompt), tuple(response), tuple(-0.1 * t for t in response), version, finish)


@pytest.mark.unit
def test_extending_prompts_merge_with_masked_extension() -> None:
    calls = [call([1, 2], [3, 4], version=2), call([1, 2, 3, 4, 9, 9], [5], version=1), call([1, 2, 3, 4, 9, 9, 5, 8], [6], version=3)]
    (sample,) = merge_session_calls(calls)
    assert sample.prompt_ids == (1, 2)
    assert sample.response_ids == [3, 4, 9, 9, 5, 8, 6]
    assert sample.response_mask == [1, 1, 0, 0, 1, 0, 1]
    assert sample.logprobs == pytest.approx([-0.3, -0.4, 0.0, 0.0, -0.5, 0.0, -0.6])
    assert (sample.policy_version, sample.num_calls) == (1, 3)


@pytest.mark.unit
def test_a_prompt_that_rewrites_history_starts_a_new_sample() -> None:
    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 7, 9], [5]), call([1, 2, 3, 7, 9, 5], [6], finish="length")]
    first, second = merge_session_calls(calls)
    assert (first.prompt_ids, first.response_ids, first.response_mask) == ((1, 2), [3, 4], [1, 1])
    assert second.prompt_ids == (1, 2, 3, 7, 9)
    assert (second.response_ids, second.response_mask) == ([5, 6], [1, 1])
    assert second.last_finish_reason == "length"


@pytest.mark.unit
def test_from_json_rejects_mismatched_logprobs() -> None:
    raw = {"prompt_ids": [1], "response_ids": [2, 3], "logprobs": [-1.0], "policy_version": 0, "finish_reason": "stop"}
    with pytest.raises(ValueError, match="session 's' call 0: 2 response ids but 1 logprobs"):
        SessionCall.from_json(raw, "session 's' call 0")
    with pytest.raises(ValueError, match="malformed recorded call"):
        SessionCall.from_json({"prompt_ids": [1]}, "x")
