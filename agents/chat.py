"""Chat-template and token utilities for agent loops (agents layer: pure, tokenizer only).

Two things the loops need from a chat template, both as token ids:

- ``prompt_ids``: the rendering of the row's messages with the tool schemas and an open assistant turn;
- ``tool_delta_ids``: the tokens to append after the model's own output so that the sequence continues
  as the template would render ``conversation + [tool messages]`` with an open assistant turn.

The delta is computed against a fixed dummy conversation whose last turn is an assistant message with
a unique marker as content: everything the template renders after that marker's end-of-turn text is the
delta. A default system prompt (Qwen2.5) or a reasoning block the template adds only to the *last*
assistant turn (Qwen3) lives before the marker, so it never leaks into the delta.

The model's output is never re-tokenized. If it stopped at the end-of-turn token (``<|im_end|>``) the
template's remaining end-of-turn text (``\\n``) is all that is missing; if it stopped elsewhere, the
whole end-of-turn text is added (masked, like every delta token).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Message = dict[str, Any]

_MARKER = "\u2063tandem-dummy-assistant-7f3a\u2063"
_DUMMY_PREFIX: tuple[Message, ...] = (
    {"role": "system", "content": "dummy system"},
    {"role": "user", "content": "dummy user"},
    {"role": "assistant", "content": _MARKER},
)


class ChatTokenizer(Protocol):
    """What the chat utilities need of a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def render_text(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """The template's text for ``messages`` (tool schemas rendered when ``tools`` is non-empty)."""
    return tokenizer.apply_chat_template(
        list(messages), tools=list(tools) if tools else None, add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def encode(tokenizer: ChatTokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (the chat template writes its own)."""
    # Chat templates write their own special tokens; a BOS added here would be a second one.
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_ids(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Prompt ids: the template rendering of ``messages`` + tool schemas, tokenized as a whole."""
    return encode(tokenizer, render_text(tokenizer, messages, tools, add_generation_prompt))


def _text_after_marker(rendered: str, where: str) -> str:
    index = rendered.rfind(_MARKER)
    if index < 0:
        raise ValueError(f"chat template dropped the dummy assistant content while rendering {where}")
    return rendered[index + len(_MARKER):]


class ChatDelta:
    """Per-tokenizer helper computing prompt ids and tool-message deltas (built once per worker)."""

    def __init__(self, tokenizer: ChatTokenizer):
        self.tokenizer = tokenizer
        prefix = render_text(tokenizer, _DUMMY_PREFIX)
        # What the template writes after an assistant turn's content: "<|im_end|>\n" for ChatML.
        self.end_of_turn_text = _text_after_marker(prefix, "the dummy prefix")
        self.end_of_turn_ids = tuple(encode(tokenizer, self.end_of_turn_text))
        if not self.end_of_turn_ids:
            raise ValueError("chat template writes nothing after an assistant turn; cannot delimit turns")

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None) -> list[int]:
        return render_ids(self.tokenizer, messages, tools, add_generation_prompt=True)

    def end_of_turn_missing(self, output_ids: Sequence[int]) -> list[int]:
        """The end-of-turn ids the model did not produce itself.

        The longest ``k`` such that ``output_ids`` ends with the first ``k`` end-of-turn ids counts as
        produced (``<|im_end|>`` -> only ``\\n`` is missing); the rest is returned.
        """
        eot = self.end_of_turn_ids
        for k in range(min(len(eot), len(output_ids)), 0, -1):
            if tuple(output_ids[len(output_ids) - k:]) == eot[:k]:
                return list(eot[k:])
        return list(eot)

    def messages_delta_ids(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Ids the template renders for ``messages`` after a closed assistant turn."""
        if not messages:
            raise ValueError("messages_delta_ids needs at least one message")
        rendered = render_text(self.tokenizer, [*_DUMMY_PREFIX, *messages], None, add_generation_prompt)
        after = _text_after_marker(rendered, f"{len(messages)} appended message(s)")
        if not after.startswith(self.end_of_turn_text):
            raise ValueError(
                f"chat template renders the assistant end of turn as {after[:40]!r} before appended messages, "
                f"but as {self.end_of_turn_text!r} at the end of a conversation"
            )
        # The delta begins after the end-of-turn text, which ends at a special-token boundary in ChatML
        # templates, so encoding it alone gives the same ids as encoding it in context.
        return encode(self.tokenizer, after[len(self.end_of_turn_text):])

    def tool_delta_ids(self, output_ids: Sequence[int], messages: Sequence[Message]) -> list[int]:
        """Ids to append after the model's ``output_ids`` for ``messages`` (tool/user turns) + gen prompt."""
        return self.end_of_turn_missing(output_ids) + self.messages_delta_ids(messages)

    def assistant_text(self, output_ids: Sequence[int]) -> str:
        """The assistant message content the model wrote (its end-of-turn tokens removed)."""
        produced = len(self.end_of_turn_ids) - len(self.end_of_turn_missing(output_ids))
        content_ids = list(output_ids[: len(output_ids) - produced])
        return self.tokenizer.decode(content_ids, skip_special_tokens=False)
