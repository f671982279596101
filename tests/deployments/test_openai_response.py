"""Building OpenAI chat completions from sampled token ids (the ingress's pure functions)."""

import json
import re

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


def test_stop_strings_cut_the_answer_and_the_recorded_ids_end_at_the_stop(qwen_tokenizer):
    from deployments.openai_ingress import apply_stop

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
    from deployments.openai_ingress import logprobs_content

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
