"""Strict hermes tool-call format (agents layer: pure Python).

``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and nothing else: closed tags, strict
JSON, ``name`` a string and ``arguments`` an object. This is how verl's and vLLM's hermes parsers
read Qwen output, kept as the baseline the benchmark compares against.
"""

from __future__ import annotations

import json

from agents.parsers._common import CallDecodeError, parse_closed_blocks, snippet
from agents.records import ParsedToolCalls, ToolCall

def _decode(body: str) -> ToolCall:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise CallDecodeError(f"invalid JSON ({exc}): {snippet(body)}") from None
    name = value.get("name") if isinstance(value, dict) else None
    arguments = value.get("arguments") if isinstance(value, dict) else None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise CallDecodeError(f"expected {{\"name\": str, \"arguments\": object}}: {snippet(body)}")
    return ToolCall(name=name, arguments=arguments)


def parse(text: str) -> ParsedToolCalls:
    """Calls from closed ``<tool_call>`` blocks; every other byte of ``text`` is content."""
    return parse_closed_blocks(text, _decode)
