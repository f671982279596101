"""Building OpenAI chat completions from sampled token ids (the ingress's pure functions)."""

import json

import pytest
from transformers import AutoTokenizer

from agents.records import GenerateResult
from deployments.openai_ingress import ChatCompletionRequest, build_chat_completion, completion_message

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
        completion_id="chatcmpl-1", model="tiny", prompt_len=10, result=_result(ids), message=message, created=7
    )
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["usage"] == {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 10 + len(ids)}
    assert completion["object"] == "chat.completion" and completion["created"] == 7


def test_plain_answer_keeps_text_and_engine_finish_reason(qwen_tokenizer):
    ids = qwen_tokenizer.encode("The answer is 42.<|im_end|>", add_special_tokens=False)
    message = completion_message(ids, qwen_tokenizer, "qwen25_coder", parse_tools=True)
    assert message == {"role": "assistant", "content": "The answer is 42."}
    completion = build_chat_completion(
        completion_id="c", model="m", prompt_len=1, result=_result(ids, "length"), message=message
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
    for bad in ({"n": 2}, {"stream": True}, {"tool_choice": "required"}, {"temperature": -1}):
        with pytest.raises(ValueError):
            ChatCompletionRequest.model_validate({**base, **bad})
