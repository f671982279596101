"""Render a conversation with the token ids the model sampled for its earlier answers (deployments layer; pure).

An agent framework sends the whole conversation back on every call, and the chat template re-renders the model's
earlier answers from their text and parsed ``tool_calls``. That need not give the ids the model sampled: a call the
model wrote as a fenced JSON block or ``<tools>`` comes back rendered in the template's own (hermes) format, and a
text can tokenize differently from how it was sampled. The recorded session then no longer extends token for token
and is split into separate samples (``agents.loops.session_merge``).

``replay_prompt_ids`` fixes that when the session has recorded calls: an assistant message equal to what a recorded
answer parses to (same content, same calls with the same arguments) is rendered as exactly that answer's ids. The
template renders the conversation once with a placeholder in place of each such message's content (and without its
``tool_calls``); the text between placeholders is tokenized as usual and each placeholder becomes the recorded ids.
When the answer ended with the end-of-turn token the template writes after it, that token is not written twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agents.loops.session_merge import SessionCall
from agents.parsers import _END_MARKERS, parse_tool_calls, strip_end_markers

PLACEHOLDER = "TandemReplayedAnswer{}x"


def _key(content: Any, calls: Sequence[tuple[str, Any]]) -> tuple[str, str]:
    return (str(content or "").strip(), json.dumps(list(calls), sort_keys=True, ensure_ascii=False))


def message_key(message: dict[str, Any]) -> tuple[str, str] | None:
    """What an assistant message says: its content and its calls (name, parsed arguments); None if unreadable."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        calls.append((function.get("name"), arguments))
    return _key(content, calls)


def answer_keys(call: SessionCall, tokenizer: Any, parser: str) -> set[tuple[str, str]]:
    """The messages a recorded answer is returned as: its text, and its parsed content and calls."""
    text = strip_end_markers(tokenizer.decode(list(call.response_ids), skip_special_tokens=False), tokenizer)
    keys = {_key(text, [])}
    parsed = parse_tool_calls(text, parser)
    if parsed.calls:
        keys.add(_key(parsed.content, [(c.name, c.arguments) for c in parsed.calls]))
    return keys


def replay_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      calls: Sequence[SessionCall], parser: str) -> tuple[tuple[int, ...] | None, int]:
    """The prompt ids of ``messages`` with each assistant message that matches a recorded answer rendered as that
    answer's ids, and how many were; ``(None, 0)`` when none matches (render as usual)."""
    by_key: dict[tuple[str, str], SessionCall] = {}
    for call in calls:
        for key in answer_keys(call, tokenizer, parser):
            by_key.setdefault(key, call)
    replayed: list[SessionCall] = []
    rendered = []
    for message in messages:
        key = message_key(message) if message.get("role") == "assistant" else None
        if key is not None and key in by_key:
            rendered.append({"role": "assistant", "content": PLACEHOLDER.format(len(replayed))})
            replayed.append(by_key[key])
        else:
            rendered.append(message)
    if not replayed:
        return None, 0
    text = tokenizer.apply_chat_template(rendered, tools=tools, add_generation_prompt=True, tokenize=False)
    pieces = []
    for i in range(len(replayed)):
        before, marker, text = text.partition(PLACEHOLDER.format(i))
        if not marker or PLACEHOLDER.format(i) in text:
            return None, 0  # the template changed or repeated the placeholder: render as usual
        pieces.append(before)
    ids: list[int] = []
    for before, call in zip(pieces, replayed):
        ids += tokenizer.encode(_after_end(before, ids, tokenizer), add_special_tokens=False) + list(call.response_ids)
    ids += tokenizer.encode(_after_end(text, ids, tokenizer), add_special_tokens=False)
    return tuple(ids), len(replayed)


def _after_end(text: str, ids: list[int], tokenizer: Any) -> str:
    """``text`` without the end-of-turn token it starts with when the ids so far already end with that token."""
    if ids:
        last = tokenizer.decode([ids[-1]], skip_special_tokens=False)
        if last and last in {*_END_MARKERS, tokenizer.eos_token} and text.startswith(last):
            return text[len(last):]
    return text
