"""The pure half of the ``agent_lightning`` loop: a rollout's input from a row, recorded calls read from Agent
Lightning's ``model_request`` events, and the limits a trajectory is cut to (the HTTP half runs against a real
agl-server in tests/apps/test_agent_lightning.py)."""

import pytest

from agents.loops.agent_lightning import RolloutFailed, RolloutRecord, _trajectory, call_from_event, rollout_input
from agents.loops.episode import Episode, LoopLimits
from agents.loops.session_merge import merge_session_calls
from agents.records import SamplingParams, Termination

EPISODE = Episode(trajectory_id="g-1", group_id="g", messages=({"role": "system", "content": "s"},
                                                              {"role": "user", "content": "What is 2+2?"}),
                  agent_name="agent_lightning", data_source="arith", ground_truth="4", sampling=SamplingParams(),
                  extra_info={"index": 3, "question": "2+2", "tools_kwargs": {"x": {}}})


def _chat_event(prompt, ids, logprobs=True, version=2, finish="stop"):
    choice = {"index": 0, "message": {"role": "assistant", "content": "four"}, "finish_reason": finish, "token_ids": ids}
    if logprobs:
        choice["logprobs"] = {"content": [{"token": "x", "logprob": -0.5} for _ in ids]}
    return {"status": "ok", "http_status": 200,
            "response": {"prompt_token_ids": prompt, "choices": [choice], "system_fingerprint": f"policy-v{version}"}}


def test_the_input_carries_the_row_and_resolves_paths_naming_the_row_on_a_bad_one():
    data = rollout_input(EPISODE, {"q": "messages.-1.content", "gt": "ground_truth", "idx": "extra_info.index"})
    assert data["q"] == "What is 2+2?" and data["gt"] == "4" and data["idx"] == 3
    assert data["data_id"] == "3" and data["question"] == "2+2" and "tools_kwargs" not in data
    assert data["messages"][1]["content"] == "What is 2+2?" and data["data_source"] == "arith"
    with pytest.raises(ValueError, match=r"row 3: .*'messages.5.content' does not resolve at '5'"):
        rollout_input(EPISODE, {"q": "messages.5.content"})


def test_a_chat_event_becomes_a_call_with_its_version_and_completions_logprobs_are_read_too():
    call = call_from_event(_chat_event([1, 2], [5, 6, 7]), "e", need_logprobs=True)
    assert call.prompt_ids == (1, 2) and call.response_ids == (5, 6, 7) and call.logprobs == (-0.5,) * 3
    assert call.policy_version == 2 and call.finish_reason == "stop"
    text = {"status": "ok", "response": {"choices": [{"text": "4", "token_ids": [9], "prompt_token_ids": [1],
                                                      "logprobs": {"token_logprobs": [-0.1]}, "finish_reason": "length"}]}}
    call = call_from_event(text, "e", need_logprobs=True)
    assert call.prompt_ids == (1,) and call.logprobs == (-0.1,) and call.policy_version == 0


def test_missing_ids_or_logprobs_are_errors_except_logprobs_in_validation():
    with pytest.raises(ValueError, match="rollout r event 4: the recorded response has no token ids"):
        call_from_event({"response": {"choices": [{"message": {"content": "x"}}]}}, "rollout r event 4", need_logprobs=True)
    with pytest.raises(ValueError, match="3 response ids but 0 logprobs"):
        call_from_event(_chat_event([1], [5, 6, 7], logprobs=False), "e", need_logprobs=True)
    assert call_from_event(_chat_event([1], [5, 6, 7], logprobs=False), "e", need_logprobs=False).logprobs == (0.0,) * 3


def test_a_long_answer_is_cut_to_the_response_budget_and_a_long_prompt_follows_truncation():
    calls = [call_from_event(_chat_event([1, 2, 3], list(range(10, 20))), "e", need_logprobs=True)]
    (sample,) = merge_session_calls(calls)
    record = RolloutRecord("r", "succeeded", calls, [1.0], 0, "four")
    t = _trajectory(EPISODE, sample, 0, 1.0, record, False, LoopLimits(max_response_length=4, max_model_len=64))
    assert t.response_ids == (10, 11, 12, 13) and len(t.rollout_logprobs) == 4
    assert t.termination is Termination.RESPONSE_BUDGET and t.metrics["agl_response_cut"] == 1.0
    with pytest.raises(ValueError, match="row 3: prompt has 3 tokens, max_prompt_length is 2"):
        _trajectory(EPISODE, sample, 0, 1.0, record, False, LoopLimits(4, 64, max_prompt_length=2))
    left = _trajectory(EPISODE, sample, 0, 1.0, record, False, LoopLimits(10, 64, max_prompt_length=2, truncation="left"))
    assert left.prompt_ids == (2, 3) and left.termination is Termination.ANSWERED


def test_a_0_3_rollouts_reward_is_its_last_reward_span_in_either_encoding():
    from agents.loops.agent_lightning_store import final_reward, span_reward
    from agents.loops.session_merge import agl_session_id

    returned = {"name": "agentlightning.annotation", "sequence_id": 3,
                "attributes": {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.25}}
    emitted = {"name": "agentlightning.annotation", "sequence_id": 5,
               "attributes": {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1,
                              "agentlightning.reward.1.name": "length", "agentlightning.reward.1.value": 7}}
    legacy = {"name": "agentlightning.annotation", "sequence_id": 1, "attributes": {"reward": 0.5}}
    other = {"name": "openai.chat.completion", "sequence_id": 2, "attributes": {"reward": 9.0}}
    assert [span_reward(s) for s in (returned, emitted, legacy, other)] == [0.25, 1.0, 0.5, None]
    assert final_reward([emitted, other, returned, legacy]) == (1.0, 3)  # by sequence, the primary dimension
    assert final_reward([other]) == (None, 0)
    assert agl_session_id("ro-1", "at-2") == "agl:ro-1:at-2"


def test_a_0_3_store_wait_that_times_out_is_asked_again_until_the_rollout_finishes():
    import asyncio

    import httpx

    from agents.loops.agent_lightning import AglSettings
    from agents.loops.agent_lightning_store import AglStoreClient

    waits = []

    def store(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/waits/rollouts"):
            waits.append(request)
            if len(waits) == 1:  # a busy store holds the first long-poll past the client's timeout
                raise httpx.ReadTimeout("timed out", request=request)
            return httpx.Response(200, json=[{"rollout_id": "ro-1", "status": "succeeded"}])
        return httpx.Response(200, json={"rollout_id": "ro-1", "status": "succeeded", "attempt": {"attempt_id": "at-1"}})

    client = AglStoreClient(AglSettings(store_url="http://store"), "http://ingress/v1")
    client._store = httpx.AsyncClient(base_url="http://store/v1/agl", transport=httpx.MockTransport(store))
    assert asyncio.run(client._wait("ro-1"))["attempt"]["attempt_id"] == "at-1"
    assert len(waits) == 2

    def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="store error")

    client._store = httpx.AsyncClient(base_url="http://store/v1/agl", transport=httpx.MockTransport(broken))
    with pytest.raises(RolloutFailed, match="answered 500"):  # anything else than a timeout still fails the rollout
        asyncio.run(client._wait("ro-1"))
