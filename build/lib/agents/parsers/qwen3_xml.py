"""Qwen3-Coder XML tool-call format (agents layer: pure Python).

``<tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>``. Parameter
values are raw text; a value that parses as JSON (numbers, booleans, lists, objects, quoted strings)
becomes that JSON value, any other value stays a string. ``parse_xml_call`` is shared with the
universal ``qwen25_coder`` parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agents.parsers._common import CallDecodeError, parse_closed_blocks, snippet
from agents.records import ParsedToolCalls, ToolCall

_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]*)>(.*)</function>\s*\Z", re.DOTALL)
_PARAMETER_RE = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}\Z")


def parse_xml_call(body: str) -> ToolCall:
    """One ``<function=...>`` element (the inside of a ``<tool_call>`` block) as a ToolCall."""
    match = _FUNCTION_RE.match(body)
    if match is None:
        raise CallDecodeError(f"expected <function=NAME>...</function>: {snippet(body)}")
    name = match.group(1).strip()
    if not _NAME_RE.match(name):
        raise CallDecodeError(f"invalid tool name {snippet(name, 40)}")
    inner = match.group(2)
    if "<function=" in inner:
        raise CallDecodeError(f"tool {name!r}: several <function=...> in one <tool_call> block")
    leftover = _PARAMETER_RE.sub("", inner)
    if leftover.strip():
        raise CallDecodeError(f"tool {name!r}: text outside <parameter> tags: {snippet(leftover)}")
    arguments: dict[str, Any] = {}
    for parameter in _PARAMETER_RE.finditer(inner):
        key = parameter.group(1).strip()
        if not key or key in arguments:
            raise CallDecodeError(f"tool {name!r}: empty or repeated parameter name {key!r}")
        arguments[key] = _parameter_value(parameter.group(2))
    return ToolCall(name=name, arguments=arguments)


def _parameter_value(raw: str) -> Any:
    # The chat template writes "<parameter=p>\nvalue\n</parameter>": those two newlines are framing.
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        return json.loads(value, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return value


def _reject_constant(token: str) -> Any:
    # NaN/Infinity are not JSON; "NaN" written by the model stays the string it wrote.
    raise ValueError(f"not a JSON constant: {token}")


def parse(text: str) -> ParsedToolCalls:
    """Calls from closed ``<tool_call>`` blocks holding one ``<function=...>`` each."""
    return parse_closed_blocks(text, parse_xml_call)
