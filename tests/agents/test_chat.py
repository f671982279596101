"""Chat-template deltas against the tiny tokenizer and the real Qwen tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agents.chat import ChatDelta, render_ids, render_text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "execute_sql",
            "description": "Run one query.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'


@pytest.fixture(scope="module", params=["tiny", "qwen"])
def tokenizer(request: pytest.FixtureRequest):
    folder: Path = request.getfixturevalue("tiny_model_dir" if request.param == "tiny" else "qwen_tokenizer_dir")
    return AutoTokenizer.from_pretrained(folder)


def _im_end(tokenizer) -> int:
    return tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.unit
def test_end_of_turn_is_im_end_newline(tokenizer) -> None:
    chat = ChatDelta(tokenizer)
    assert chat.end_of_turn_text == "<|im_end|>\n"
    assert chat.end_of_turn_ids == (_im_end(tokenizer), tokenizer.encode("\n", add_special_tokens=False)[0])


@pytest.mark.unit
def test_prompt_ids_equal_template_tokenization(tokenizer) -> None:
    messages = [{"role": "user", "content": "How many claims?"}]
    chat = ChatDelta(tokenizer)
    ids = chat.prompt_ids(messages, TOOLS)
    text = render_text(tokenizer, messages, TOOLS, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text
    assert text.endswith("<|im_start|>assistant\n")
    assert '"name": "execute_sql"' in text
    assert ids == render_ids(tokenizer, messages, TOOLS)


@pytest.mark.unit
@pytest.mark.parametrize("with_system", [False, True])
@pytest.mark.parametrize("stopped_at_eos", [True, False])
def test_delta_continues_the_rendering_token_for_token(tokenizer, with_system: bool, stopped_at_eos: bool) -> None:
    """prompt + model output + delta == tokenization of the rendered conversation (open assistant turn)."""
    chat = ChatDelta(tokenizer)
    messages = [{"role": "user", "content": "How many claims?"}]
    if with_system:
        messages.insert(0, {"role": "system", "content": "You answer SQL questions."})
    output = tokenizer.encode(CALL_TEXT, add_special_tokens=False)
    if stopped_at_eos:
        output.append(_im_end(tokenizer))
    tool_messages = [{"role": "tool", "content": "[(3,)]"}, {"role": "tool", "content": "Error: no such table"}]
    prompt = chat.prompt_ids(messages, TOOLS)
    delta = chat.tool_delta_ids(output, tool_messages)

    conversation = [*messages, {"role": "assistant", "content": chat.assistant_text(output)}, *tool_messages]
    expected = render_text(tokenizer, conversation, TOOLS, add_generation_prompt=True)
    assert tokenizer.decode(prompt + output + delta) == expected
    assert prompt + output + delta == tokenizer.encode(expected, add_special_tokens=False)
    # The delta starts right after what the model wrote: "\n" after <|im_end|>, else the whole "<|im_end|>\n".
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert delta[: 1 if stopped_at_eos else 2] == (newline if stopped_at_eos else [_im_end(tokenizer), *newline])
    assert tokenizer.decode(delta).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.unit
def test_qwen_default_system_prompt_does_not_leak_into_delta(qwen_tokenizer_dir: Path) -> None:
    """The real Qwen template adds a system block only with tools; the delta never contains one."""
    tokenizer = AutoTokenizer.from_pretrained(qwen_tokenizer_dir)
    chat = ChatDelta(tokenizer)
    delta_text = tokenizer.decode(chat.messages_delta_ids([{"role": "tool", "content": "42"}]))
    assert delta_text == "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.unit
def test_tiny_default_system_prompt_does_not_leak_into_delta(tiny_model_dir: Path) -> None:
    """The tiny (Qwen2.5-style) template injects a default system prompt when none is given."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert render_text(tokenizer, [{"role": "user", "content": "hi"}]).startswith("<|im_start|>system\nYou are")
    chat = ChatDelta(tokenizer)
    delta_text = tokenizer.decode(chat.messages_delta_ids([{"role": "user", "content": "next"}]))
    assert delta_text == "<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.unit
def test_end_of_turn_missing_counts_partial_overlap(tokenizer) -> None:
    chat = ChatDelta(tokenizer)
    im_end, newline = chat.end_of_turn_ids
    assert chat.end_of_turn_missing([5, 6, im_end]) == [newline]
    assert chat.end_of_turn_missing([5, 6]) == [im_end, newline]
    assert chat.end_of_turn_missing([5, im_end, newline]) == []
    assert chat.end_of_turn_missing([]) == [im_end, newline]
    assert chat.assistant_text([*tokenizer.encode("ok", add_special_tokens=False), im_end]) == "ok"
