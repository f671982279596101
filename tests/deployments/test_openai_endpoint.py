"""The OpenAI-compatible endpoint of the shared app, called with the ``openai`` client and httpx."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from agents.parsers import strip_end_markers
from tests.deployments.tool_call_adapter import MESSAGES, TOOLS

pytestmark = pytest.mark.integration


def _client(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=app.base_url, api_key=app.api_key, max_retries=0, timeout=120)


def _auth(app) -> dict[str, str]:
    return {"Authorization": f"Bearer {app.api_key}"}


def test_chat_completion_is_recorded_token_exact_under_the_session(rollout_app):
    tokenizer = AutoTokenizer.from_pretrained(rollout_app.model_dir)
    client = _client(rollout_app)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    session = {"x-session-id": "sess-plain"}
    response = client.chat.completions.create(
        model="tiny", messages=messages, temperature=0, max_tokens=8, seed=0, extra_headers=session
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert response.usage.prompt_tokens == len(expected_prompt)

    record = httpx.get(f"{rollout_app.base_url}/sessions/sess-plain", headers=_auth(rollout_app)).json()
    [call] = record["calls"]
    assert call["prompt_ids"] == expected_prompt
    assert len(call["response_ids"]) == len(call["logprobs"]) == response.usage.completion_tokens
    decoded = strip_end_markers(tokenizer.decode(call["response_ids"], skip_special_tokens=False), tokenizer)
    assert choice.message.content == decoded
    assert response.system_fingerprint == f"policy-v{call['policy_version']}"

    follow_up = [*messages, {"role": "assistant", "content": decoded}, {"role": "user", "content": "Again."}]
    client.chat.completions.create(model="tiny", messages=follow_up, max_tokens=4, extra_headers=session)
    calls = rollout_app.ingress.pop_session.remote("sess-plain").result()
    assert [c.prompt_ids[: len(expected_prompt)] for c in calls] == [tuple(expected_prompt)] * 2
    assert rollout_app.ingress.pop_session.remote("sess-plain").result() == []
    missing = httpx.get(f"{rollout_app.base_url}/sessions/sess-plain", headers=_auth(rollout_app))
    assert missing.status_code == 404


def test_models_lists_the_served_model(rollout_app):
    [model] = _client(rollout_app).models.list().data
    assert model.id == rollout_app.model_dir.name


def test_every_route_answers_401_in_openais_shape_without_the_token_and_the_token_stays_out_of_logs(rollout_app):
    from fastapi.routing import APIRoute

    from deployments.openai_ingress import OPEN_PATHS, app

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "prompt": "hi"}
    routes = [(method, r.path) for r in app.routes if isinstance(r, APIRoute) and r.path not in OPEN_PATHS
              for method in r.methods]
    assert {path for _, path in routes} >= {"/v1/models", "/v1/chat/completions", "/v1/completions",
                                            "/v1/sessions/{session_id}"}
    root = rollout_app.base_url.removesuffix("/v1")
    # the readiness probe is open (a Kubernetes probe carries no token) and says only that the replicas run
    health = httpx.get(f"{root}/health", timeout=60)
    assert health.status_code == 200 and health.json() == {"status": "ok", "rollout_replicas": 2}, health.text
    for method, path in routes:
        url = root + path.replace("{session_id}", "sess-any")
        for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": rollout_app.api_key},
                        {"Authorization": f"Bearer {rollout_app.api_key}x"}):
            for stream in ((False, True) if method == "POST" else (False,)):
                response = httpx.request(method, url, json={**body, "stream": stream} if method == "POST" else None,
                                         headers=headers, timeout=60)
                assert response.status_code == 401, (method, path, headers, stream, response.text)
                error = response.json()["error"]
                assert error["code"] == "invalid_api_key" and "bearer token" in error["message"], error
    # with the token, a body the schema refuses is a 400 naming the field (without it: 401, test_access.py)
    invalid = httpx.post(f"{rollout_app.base_url}/chat/completions", json={"messages": [{"role": "user"}], "n": 99},
                         headers=_auth(rollout_app), timeout=60)
    assert invalid.status_code == 400 and "n" in invalid.json()["error"]["message"], invalid.text
    with pytest.raises(openai.AuthenticationError):  # what OpenAI's SDK raises for OpenAI's own 401
        openai.OpenAI(base_url=rollout_app.base_url, api_key="wrong", max_retries=0).models.list()
    ok = httpx.post(f"{rollout_app.base_url}/chat/completions", json=body, headers=_auth(rollout_app), timeout=120)
    assert ok.status_code == 200
    # no log file of this cluster holds the token (it reached the ingress as an argument: tests/deployments/test_access.py)
    import ray

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    leaked = [p for p in logs.rglob("*") if p.is_file() and rollout_app.api_key.encode() in p.read_bytes()]
    assert not leaked, leaked


def test_prompt_longer_than_max_model_len_is_a_400(rollout_app):
    with pytest.raises(openai.BadRequestError, match="max_model_len"):
        _client(rollout_app).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * 600}], max_tokens=4
        )


def test_tool_call_in_the_answer_comes_back_as_tool_calls(rollout_app, tool_call_adapter):
    version, _ = rollout_app.publish_next(tool_call_adapter)
    client = _client(rollout_app)
    response = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=64
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert response.system_fingerprint == f"policy-v{version}"

    # tool_choice=none: no tool schemas in the prompt and no parsing, so no tool_calls either.
    plain = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=64
    )
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason in ("stop", "length")


def test_logprobs_token_ids_and_errors_in_openais_shape(rollout_app):
    url = f"{rollout_app.base_url}/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
            "logprobs": True, "return_token_ids": True}
    reply = httpx.post(url, json=body, headers={**_auth(rollout_app), "x-session-id": "sess-lp"}, timeout=120).json()
    choice = reply["choices"][0]
    [call] = rollout_app.ingress.pop_session.remote("sess-lp").result()
    assert choice["token_ids"] == list(call.response_ids) and reply["prompt_token_ids"] == list(call.prompt_ids)
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == pytest.approx(list(call.logprobs))
    for bad, said in (({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role 'wizard'"),
                      ({"tool_choice": "required", "tools": TOOLS}, "needs constrained decoding: this app's engine "
                                                                      "is 'hf'"), ({"n": 9}, "n")):
        response = httpx.post(url, json={**body, **bad}, headers=_auth(rollout_app), timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert said in error["message"] and error["type"] == "invalid_request_error"


def test_streamed_tool_call_equals_the_non_streamed_answer(rollout_app, tool_call_adapter):
    version, _ = rollout_app.publish_next(tool_call_adapter)
    client = _client(rollout_app)
    kwargs = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "temperature": 0, "max_tokens": 64}
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    calls = [call for c in chunks if c.choices for call in (c.choices[0].delta.tool_calls or [])]
    [call] = calls
    [wanted] = whole.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert (call.function.name, call.function.arguments) == (wanted.function.name, wanted.function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    print(f"streamed tool-call transcript (policy v{version}):")
    for chunk in chunks:
        print("  " + chunk.model_dump_json(exclude_none=True))


def test_langchain_chat_openai_streams_a_bound_tool_call(rollout_app, tool_call_adapter):
    from langchain_openai import ChatOpenAI

    rollout_app.publish_next(tool_call_adapter)
    llm = ChatOpenAI(model="tiny", base_url=rollout_app.base_url, api_key=rollout_app.api_key, temperature=0,
                     max_tokens=64, max_retries=0, timeout=120, streaming=True)
    tool = TOOLS[0]
    total = None
    for piece in llm.bind_tools([tool]).stream(MESSAGES[0]["content"]):
        total = piece if total is None else total + piece
    [call] = total.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}


def test_n_samples_stream_and_are_recorded_once_each(rollout_app):
    client = _client(rollout_app)
    messages = [{"role": "user", "content": "Count."}]
    session = {"x-session-id": "sess-n"}
    response = client.chat.completions.create(model="tiny", messages=messages, n=3, max_tokens=6, seed=5,
                                              extra_headers=session, extra_body={"return_token_ids": True})
    assert [c.index for c in response.choices] == [0, 1, 2]
    calls = rollout_app.ingress.pop_session.remote("sess-n").result()
    assert [list(c.response_ids) for c in calls] == [c.model_extra["token_ids"] for c in response.choices]
    assert response.usage.completion_tokens == sum(len(c.response_ids) for c in calls)
    # sample i used seed 5 + i: a lone request with seed 6 samples what choice 1 sampled
    lone = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=6,
                                          extra_body={"return_token_ids": True})
    assert lone.choices[0].model_extra["token_ids"] == list(calls[1].response_ids)
    # streamed, the same seeds give the same samples, each choice under its index
    stream = client.chat.completions.create(model="tiny", messages=messages, n=3, max_tokens=6, seed=5, stream=True,
                                            extra_body={"return_token_ids": True})
    by_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for chunk in stream:
        for choice in chunk.choices:
            by_index[choice.index] += (choice.model_extra or {}).get("token_ids") or []
    assert [by_index[i] for i in range(3)] == [list(c.response_ids) for c in calls]


def test_completions_take_text_or_token_ids_and_stream(rollout_app):
    client = _client(rollout_app)
    tokenizer = AutoTokenizer.from_pretrained(rollout_app.model_dir)
    text = "Once upon a time"
    ids = tokenizer.encode(text, add_special_tokens=False)
    by_text = client.completions.create(model="tiny", prompt=text, max_tokens=8, temperature=0, logprobs=0,
                                        extra_body={"return_token_ids": True}, extra_headers={"x-session-id": "c1"})
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, temperature=0,
                                       extra_body={"return_token_ids": True})
    assert by_text.object == "text_completion" and by_text.model_extra["prompt_token_ids"] == ids
    assert by_ids.choices[0].model_extra["token_ids"] == by_text.choices[0].model_extra["token_ids"]
    assert by_ids.choices[0].text == by_text.choices[0].text
    [call] = rollout_app.ingress.pop_session.remote("c1").result()
    assert list(call.response_ids) == by_text.choices[0].model_extra["token_ids"]
    assert by_text.choices[0].logprobs.token_logprobs == pytest.approx(list(call.logprobs))
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=text, max_tokens=8, temperature=0, stream=True) if c.choices)
    assert streamed == by_text.choices[0].text
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="tiny", prompt=[10**9], max_tokens=2)


def test_sessions_recorded_through_either_ingress_replica(rollout_app):
    from ray import serve

    status = serve.status().applications[rollout_app.name].deployments["OpenAIIngress"]
    assert status.replica_states.get("RUNNING") == 2
    session = {"x-session-id": "sess-two-ingress"}
    for turn in range(8):  # the proxy spreads these over both ingress replicas
        httpx.post(f"{rollout_app.base_url}/chat/completions", headers={**_auth(rollout_app), **session}, timeout=120,
                   json={"messages": [{"role": "user", "content": f"turn {turn}"}], "max_tokens": 2}).raise_for_status()
    record = httpx.get(f"{rollout_app.base_url}/sessions/sess-two-ingress", headers=_auth(rollout_app)).json()
    assert len(record["calls"]) == 8
    assert len(rollout_app.ingress.pop_session.remote("sess-two-ingress").result()) == 8
