"""Replaying recorded answers: a conversation sent back by an agent framework renders with the ids the model sampled."""

import pytest
from transformers import AutoTokenizer

from agents.loops.session_merge import SessionCall, merge_session_calls
from deployments.session_replay import replay_prompt_ids
from tests.deployments.tool_call_adapter import TOOLS

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tok(qwen_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


def _call(tok, prompt_ids, text):
    ids = tuple(tok.encode(text, add_special_tokens=False))
    return SessionCall(tuple(prompt_ids), ids, tuple(-0.1 for _ in ids), 1, "stop")


def _tool_message(name, arguments, call_id):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_answers_in_non_hermes_formats_replay_token_for_token(tok):
    """Two turns whose calls the model wrote as a code fence and as a <tools> block; the client sends them back as
    parsed tool_calls (re-serialised arguments), which the template renders in hermes form."""
    history = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris, then Rome?"}]
    prompt1 = tok.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    first = _call(tok, prompt1, 'Checking.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
                                '<|im_end|>')
    history += [{"role": "assistant", "content": "Checking.",
                 "tool_calls": [_tool_message("get_weather", '{"city":"Paris"}', "call_1")]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    plain2 = tok.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    assert tuple(plain2[:len(prompt1) + len(first.response_ids)]) != tuple(prompt1) + first.response_ids  # drift

    prompt2, replayed = replay_prompt_ids(tok, history, TOOLS, [first], "qwen25_coder")
    assert replayed == 1
    assert prompt2[:len(prompt1) + len(first.response_ids)] == tuple(prompt1) + first.response_ids
    rest = tok.decode(list(prompt2[len(prompt1) + len(first.response_ids):]), skip_special_tokens=False)
    assert rest.startswith("\n<|im_start|>user\n<tool_response>\nsunny") and rest.endswith("<|im_start|>assistant\n")
    assert "<|im_end|><|im_end|>" not in tok.decode(list(prompt2), skip_special_tokens=False)

    second = _call(tok, prompt2, '<tools>{"name": "get_weather", "arguments": {"city": "Rome"}}</tools><|im_end|>')
    history += [{"role": "assistant", "content": None,
                 "tool_calls": [_tool_message("get_weather", '{"city": "Rome"}', "call_2")]},
                {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]
    prompt3, replayed = replay_prompt_ids(tok, history, TOOLS, [first, second], "qwen25_coder")
    assert replayed == 2
    assert prompt3[:len(prompt2) + len(second.response_ids)] == prompt2 + second.response_ids
    third = _call(tok, prompt3, "Sunny in Paris, rain in Rome.<|im_end|>")
    [sample] = merge_session_calls([first, second, third])  # one token-exact sample, not three
    assert sample.num_calls == 3


def test_messages_that_match_no_recorded_answer_render_as_usual(tok):
    history = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(history, add_generation_prompt=True, return_dict=False)
    call = _call(tok, prompt, "Hello!<|im_end|>")
    edited = [*history, {"role": "assistant", "content": "Hello there!"}, {"role": "user", "content": "bye"}]
    assert replay_prompt_ids(tok, edited, None, [call], "hermes") == (None, 0)
    kept = [*history, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "bye"}]
    ids, replayed = replay_prompt_ids(tok, kept, None, [call], "hermes")
    assert replayed == 1 and ids == tuple(tok.apply_chat_template(kept, add_generation_prompt=True, return_dict=False))
