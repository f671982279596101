"""Shared decoding rules of the tool-call parsers (agents layer: pure Python, no I/O, no logging).

Every format decodes JSON and turns decoded values into ``ToolCall`` records through this module,
so all formats agree on what a call looks like. Two contexts matter:

* explicit: text inside markers only a call uses (``<tool_call>``, ``<tools>``, a ```` ```tool_call ````
  fence). A block that does not decode to a call is an error: the model meant a call and botched it.
* implicit: bare JSON or a ```` ```json ```` fence. Only a value with an unmistakable call shape
  (a tool name plus ``arguments``/``parameters``) is a call; anything else is the model's answer and
  stays content, so ``{"answer": 42}`` or ``{"name": "Alice"}`` never becomes a call.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from agents.records import ParsedToolCalls, ToolCall

# Tool names as OpenAI accepts them (letters, digits, _ and -), plus "." for namespaced tools.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}\Z")
_ARGUMENT_KEYS = ("arguments", "parameters")
# ast.literal_eval is quadratic-ish on pathological input; calls are never this long.
_MAX_LITERAL_CHARS = 100_000
# A fragment that names a tool and carries arguments: the model meant a call even if it is broken.
_NAME_KEY_RE = re.compile(r"""["'](?:name|function)["']\s*:""")
_ARGS_KEY_RE = re.compile(r"""["'](?:arguments|parameters|tool_calls)["']\s*:""")


class CallDecodeError(ValueError):
    """A block that looked like a tool call could not be decoded; the message says why."""


def snippet(text: str, limit: int = 80) -> str:
    """One-line, bounded excerpt of model text for error messages."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


CLOSED_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_closed_blocks(text: str, decode: Callable[[str], ToolCall]) -> ParsedToolCalls:
    """Decode every closed ``<tool_call>`` block with ``decode`` (which raises ``CallDecodeError``);
    every byte outside the blocks is content. The strict parsers share this loop."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pieces: list[str] = []
    pos = 0
    for number, match in enumerate(CLOSED_TOOL_CALL.finditer(text), start=1):
        pieces.append(text[pos : match.start()])
        pos = match.end()
        try:
            calls.append(decode(match.group(1)))
        except CallDecodeError as exc:
            errors.append(f"<tool_call> block {number}: {exc}")
    pieces.append(text[pos:])
    return ParsedToolCalls(calls=calls, content=join_content(pieces), errors=errors)


def join_content(pieces: list[str]) -> str:
    """The text left around call blocks: each piece trimmed, empty pieces dropped, joined by newlines."""
    return "\n".join(piece.strip() for piece in pieces if piece.strip())


def looks_like_call(fragment: str) -> bool:
    """True when undecodable text still plainly names a tool and its arguments."""
    return bool(_NAME_KEY_RE.search(fragment) and _ARGS_KEY_RE.search(fragment))


def decode_lenient(body: str) -> Any:
    """Decode one JSON value the way models write it.

    Accepts strict JSON, several values in a row (returned as a list), stray closing brackets
    between or after values, and Python-literal dicts (single quotes, True/None).
    Raises ``CallDecodeError`` naming the JSON error when none of these fit.
    """
    text = body.strip()
    if not text:
        raise CallDecodeError("empty block")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        first_error = exc
    values = _decode_sequence(text)
    if values:
        return values[0] if len(values) == 1 else values
    literal = _literal_value(text)
    if literal is not None:
        return literal
    raise CallDecodeError(f"invalid JSON ({first_error}): {snippet(text)}")


def _decode_sequence(text: str) -> list[Any] | None:
    """Values written back to back (``{..}\\n{..}``, ``{..}}``); None if anything else is in between."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    pos = 0
    while pos < len(text):
        if text[pos] in " \t\r\n,}]":
            pos += 1
            continue
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        values.append(value)
    return values


def _literal_value(text: str) -> Any | None:
    """A Python literal dict/list converted to plain JSON types, or None."""
    if text[0] not in "{[" or len(text) > _MAX_LITERAL_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
        # Round trip: tuples become lists; sets, bytes and complex numbers are rejected.
        return json.loads(json.dumps(value))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def calls_from_value(value: Any, *, explicit: bool) -> list[ToolCall] | None:
    """The calls a decoded value stands for, or None when it has no call shape.

    Shapes: ``{"name", "arguments"|"parameters"}``, ``{"function": "name", ...}``, OpenAI
    ``{"type": "function", "function": {...}}``, ``{"tool_calls": [...]}`` and lists of these.
    Raises ``CallDecodeError`` for a call-shaped value whose name or arguments are invalid.
    """
    if isinstance(value, list):
        calls: list[ToolCall] = []
        for item in value:
            item_calls = calls_from_value(item, explicit=explicit)
            if item_calls is None:
                return None  # a list is a batch of calls only if every item is one
            calls.extend(item_calls)
        return calls or None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("tool_calls"), list):
        return calls_from_value(value["tool_calls"], explicit=explicit)
    call = _one_call(value, explicit=explicit)
    return None if call is None else [call]


def _one_call(obj: dict[str, Any], *, explicit: bool) -> ToolCall | None:
    function = obj.get("function")
    if isinstance(function, dict):  # OpenAI shape
        if obj.get("type", "function") != "function":
            return None
        name, source = function.get("name"), function
    elif isinstance(function, str) and "name" not in obj:  # {"function": "run_sql", "arguments": ...}
        name, source = function, obj
    else:
        name, source = obj.get("name"), obj
    if not isinstance(name, str):
        return None
    key = next((k for k in _ARGUMENT_KEYS if k in source), None)
    if key is None and not explicit:
        return None
    raw_arguments = source.get(key) if key else None
    if key == "parameters" and _is_json_schema(raw_arguments):
        return None  # the model echoed a tool definition; that is not a call
    if not _NAME_RE.match(name):
        if not explicit:
            return None
        raise CallDecodeError(f"invalid tool name {snippet(name, 40)}")
    return ToolCall(name=name, arguments=_arguments(raw_arguments, name))


def _is_json_schema(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "object" and "properties" in value


def _arguments(raw: Any, name: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):  # arguments given as a JSON string, as the OpenAI API does
        if not raw.strip():
            return {}
        try:
            decoded = decode_lenient(raw)
        except CallDecodeError as exc:
            raise CallDecodeError(f"tool {name!r}: arguments string is not JSON ({exc})") from None
        if isinstance(decoded, dict):
            return decoded
        raw = decoded
    raise CallDecodeError(f"tool {name!r}: arguments must be a JSON object, got {type(raw).__name__}")


def find_json_end(text: str, start: int) -> int | None:
    """Index just past the bracket that closes ``text[start]`` (a ``{`` or ``[``), or None.

    Tracks double- and single-quoted strings (Python-style dicts) so braces in values do not count.
    """
    return BracketWalk(start).advance(text)


class BracketWalk:
    """``find_json_end``'s walk from ``start``, kept between calls: ``advance`` on the same text made longer goes on
    where the last call stopped, so a stream reads each character of an unclosed candidate once."""

    __slots__ = ("start", "_at", "_depth", "_quote")

    def __init__(self, start: int):
        self.start = start
        self._at = start
        self._depth = 0
        self._quote = ""

    def advance(self, text: str) -> int | None:
        """Index just past the closing bracket, or None when ``text`` ends first."""
        depth, quote, i = self._depth, self._quote, self._at
        while i < len(text):
            char = text[i]
            if quote:
                if char == "\\":
                    i += 1
                elif char == quote:
                    quote = ""
            elif char in "\"'":
                quote = char
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        self._depth, self._quote, self._at = depth, quote, i
        return None
