"""Building OpenAI chat completions from sampled token ids (the ingress's pure functions)."""

import json
import re

import pytest
from transformers import AutoTokenizer

from agents.records import GenerateResult
from deployments.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    Sample,
    build_chat_completion,
    completion_message,
    forced_tool_message,
    forced_tool_schema,
    text_completion,
)
from deployments.openai_stream import chat_chunks, text_chunks

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


def _result(ids, finish_reason="stop", version=3):
    return GenerateResult(tuple(ids), tuple(-0.5 for _ in ids), finish_reason, version, "replica-a")


def test_tool_call_in_sampled_tokens_becomes_openai_tool_calls(qwen_tokenizer):
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    message = completion_message(ids, qwen_tokenizer, "hermes", parse_tools=True)
    assert message["role"] == "assistant"
    assert message["content"] == "Let me check."
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("call_")

    completion = build_chat_completion(
        completion_id="chatcmpl-1", model="tiny", prompt_len=10, answers=[(_result(ids), message)], created=7
    )
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["usage"] == {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 10 + len(ids)}
    assert completion["object"] == "chat.completion" and completion["created"] == 7


def test_plain_answer_keeps_text_and_engine_finish_reason(qwen_tokenizer):
    ids = qwen_tokenizer.encode("The answer is 42.<|im_end|>", add_special_tokens=False)
    message = completion_message(ids, qwen_tokenizer, "qwen25_coder", parse_tools=True)
    assert message == {"role": "assistant", "content": "The answer is 42."}
    completion = build_chat_completion(
        completion_id="c", model="m", prompt_len=1, answers=[(_result(ids, "length"), message)]
    )
    assert completion["choices"][0]["finish_reason"] == "length"


def test_tool_choice_none_leaves_call_text_as_content(qwen_tokenizer):
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)
    message = completion_message(ids, qwen_tokenizer, "hermes", parse_tools=False)
    assert message == {"role": "assistant", "content": text}


def test_request_model_rejects_unsupported_options():
    base = {"messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate(base).tool_choice is None
    for bad, said in (({"n": 9}, "n"), ({"tool_choice": "required"}, "forcing a tool call needs tools"),
                      ({"tool_choice": {"type": "function", "function": {"name": "f"}}, "tools": [TOOL_ADD]},
                       "names function 'f', which is not among the tools"),
                      ({"tool_choice": {"type": "function"}}, "a named tool_choice is"),
                      ({"tool_choice": "always"}, "'always' is not one of"),
                      ({"temperature": -1}, "temperature"), ({"stream_options": {"x": 1}}, "stream_options")):
        with pytest.raises(ValueError, match=said):
            ChatCompletionRequest.model_validate({**base, **bad})
    assert ChatCompletionRequest.model_validate({**base, "n": 8, "stream": True}).n == 8
    assert CompletionRequest.model_validate({"prompt": ["one"]}).prompt == "one"
    assert CompletionRequest.model_validate({"prompt": [[1, 2]]}).prompt == [1, 2]
    assert CompletionRequest.model_validate({"prompt": "x"}).max_tokens == 16
    for bad, said in (({"prompt": ["a", "b"]}, "one prompt per request"), ({"prompt": ""}, "empty prompt"),
                      ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "logprobs": 2}, "logprobs")):
        with pytest.raises(ValueError, match=said):
            CompletionRequest.model_validate(bad)


def _joined(chunks):
    """Content, tool calls (by index) and finish reasons of a chunk list, as a client accumulates them."""
    content, calls, finish = "", {}, []
    for chunk in chunks:
        [choice] = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            calls.setdefault(call["index"], {"id": call["id"], "name": "", "arguments": ""})
            calls[call["index"]]["name"] += call["function"]["name"]
            calls[call["index"]]["arguments"] += call["function"]["arguments"]
        if choice["finish_reason"]:
            finish.append(choice["finish_reason"])
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("parser, text", [
    ("hermes", ('Checking the weather.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call><|im_end|>')),
    ("qwen25_coder", 'Sure.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```<|im_end|>'),
    ("hermes", "Just prose, with é and 中文 and a { brace.<|im_end|>"),
])
def test_stream_chunks_add_up_to_the_non_streamed_message(qwen_tokenizer, parser, text):
    ids = tuple(qwen_tokenizer.encode(text, add_special_tokens=False))
    sample = Sample(_result(ids))
    message = completion_message(ids, qwen_tokenizer, parser, parse_tools=True)
    chunks = chat_chunks(completion_id="c", created=1, model="m", index=0, sample=sample, message=message,
                         tokenizer=qwen_tokenizer, parser=parser, parse_tools=True, logprobs=True, token_ids=True)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == "c" for c in chunks)
    content, calls, finish = _joined(chunks)
    assert content.strip() == (message["content"] or "")
    wanted = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
              for c in message.get("tool_calls", [])]
    assert calls == wanted
    assert finish == ["tool_calls" if wanted else "stop"]
    # one chunk per sampled token carries its id and log-prob
    per_token = [c["choices"][0] for c in chunks if "token_ids" in c["choices"][0]]
    assert [t for c in per_token for t in c["token_ids"]] == list(ids)
    assert [e["logprob"] for c in per_token for e in c["logprobs"]["content"]] == [-0.5] * len(ids)
    if wanted:  # a call is sent once its block is complete, not before its last token
        first_call = next(i for i, c in enumerate(chunks) if c["choices"][0]["delta"].get("tool_calls"))
        assert first_call > 1


def test_stream_after_a_stop_string_ends_at_the_text_before_it(qwen_tokenizer):
    from deployments.openai_protocol import apply_stop

    text = "Thought: add them\nObservation: 5"
    ids = tuple(qwen_tokenizer.encode(text, add_special_tokens=False))
    kept, _, before = apply_stop(ids, tuple(-0.5 for _ in ids), qwen_tokenizer, ["Observation:"])
    sample = Sample(_result(kept), before)
    chunks = chat_chunks(completion_id="c", created=1, model="m", index=2, sample=sample,
                         message={"role": "assistant", "content": before}, tokenizer=qwen_tokenizer, parser="hermes",
                         parse_tools=False, logprobs=False, token_ids=False)
    assert _joined(chunks)[0] == before == "Thought: add them\n"
    assert {c["choices"][0]["index"] for c in chunks} == {2}
    text_out = text_chunks(completion_id="t", created=1, model="m", index=0, sample=sample, tokenizer=qwen_tokenizer,
                           logprobs=True, token_ids=False)
    assert "".join(c["choices"][0]["text"] for c in text_out) == before
    assert text_out[-1]["choices"][0]["finish_reason"] == "stop"
    whole = text_completion(completion_id="t", model="m", prompt_len=3, samples=[sample, Sample(_result(ids))],
                            tokenizer=qwen_tokenizer, logprobs=True)
    assert [c["text"] for c in whole["choices"]] == [before, text]
    assert whole["usage"]["completion_tokens"] == len(kept) + len(ids)
    assert whole["choices"][1]["logprobs"]["token_logprobs"] == [-0.5] * len(ids)


def test_stop_strings_cut_the_answer_and_the_recorded_ids_end_at_the_stop(qwen_tokenizer):
    from deployments.openai_protocol import apply_stop

    text = "Thought: look it up\nAction: search\nObservation: 42 apples\nThought: done"
    ids = tuple(qwen_tokenizer.encode(text, add_special_tokens=False))
    logprobs = tuple(-float(i) for i in range(len(ids)))
    kept, kept_lp, before = apply_stop(ids, logprobs, qwen_tokenizer, ["Observation:", "never"])
    assert before == "Thought: look it up\nAction: search\n"
    decoded = qwen_tokenizer.decode(list(kept))
    assert "Observation:" in decoded and "42" not in decoded  # up to the token that completed the stop, no further
    assert kept_lp == logprobs[:len(kept)]
    assert apply_stop(ids, logprobs, qwen_tokenizer, ["absent"]) == (ids, logprobs, None)


def test_logprobs_and_token_ids_extensions_and_message_checks(qwen_tokenizer):
    from deployments.openai_protocol import logprobs_content

    ids = tuple(qwen_tokenizer.encode("Hello there", add_special_tokens=False))
    content = logprobs_content(ids, tuple(-0.25 for _ in ids), qwen_tokenizer)["content"]
    assert "".join(c["token"] for c in content) == "Hello there" and all(c["logprob"] == -0.25 for c in content)
    base = {"messages": [{"role": "user", "content": "hi"}]}
    assert ChatCompletionRequest.model_validate({**base, "stop": "X"}).stop == ["X"]
    for bad, said in (({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role 'wizard'"),
                      ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be a string"),
                      ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
                       "non-text parts"),
                      ({**base, "stop": ["a", "b", "c", "d", "e"]}, "at most 4"),
                      ({**base, "top_logprobs": 3}, "top_logprobs")):
        with pytest.raises(ValueError, match=re.escape(said)):
            ChatCompletionRequest.model_validate(bad)


TOOL_ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
TOOL_NOW = {"type": "function", "function": {"name": "now"}}  # no parameters


def test_forced_tool_choice_schemas_are_vllms_two_shapes():
    base = {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL_ADD, TOOL_NOW]}
    required = ChatCompletionRequest.model_validate({**base, "tool_choice": "required"})
    named = ChatCompletionRequest.model_validate({**base, "tool_choice": {"type": "function",
                                                                          "function": {"name": "add"}}})
    auto = ChatCompletionRequest.model_validate({**base, "tool_choice": "auto"})
    assert (required.forced_tool, named.forced_tool, auto.forced_tool) == ("required", "add", None)
    schema = forced_tool_schema("required", base["tools"])
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["add"], ["now"]]
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {"type": "object"}
    assert forced_tool_schema("add", base["tools"]) == TOOL_ADD["function"]["parameters"]


def _sample_of(text, tokenizer, finish="stop"):
    ids = tuple(tokenizer.encode(text, add_special_tokens=False))
    return Sample(GenerateResult(token_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason=finish,
                                 policy_version=2, token_versions=(2,) * len(ids)))


def test_a_forced_answer_becomes_tool_calls_and_one_cut_short_stays_content(qwen_tokenizer):
    sample = _sample_of('[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "now", "parameters": {}}]',
                        qwen_tokenizer)
    message = forced_tool_message(sample, qwen_tokenizer, "required")
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("add", {"a": 1, "b": 2}), ("now", {})]
    named = forced_tool_message(_sample_of('{"a": 3, "b": 4}', qwen_tokenizer), qwen_tokenizer, "add")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in named["tool_calls"]] == [
        ("add", {"a": 3, "b": 4})]
    cut = forced_tool_message(_sample_of('{"a": 3, "b"', qwen_tokenizer, "length"), qwen_tokenizer, "add")
    assert cut == {"role": "assistant", "content": '{"a": 3, "b"'}
    # streamed: no content, the calls with the last token, finish reason tool_calls
    chunks = chat_chunks(completion_id="c", created=0, model="m", index=0, sample=sample, message=message,
                         tokenizer=qwen_tokenizer, parser="hermes", parse_tools=True, logprobs=True, token_ids=True,
                         forced=True)
    content, calls, finish = _joined(chunks)
    assert content == "" and finish == ["tool_calls"]
    assert [{"name": c["name"], "arguments": c["arguments"]} for c in calls] == [
        c["function"] for c in message["tool_calls"]]
    assert sum(1 for c in chunks if c["choices"][0].get("token_ids")) == len(sample.result.token_ids)
