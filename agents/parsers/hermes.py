"""Strict hermes tool-call format (agents layer: pure Python).

``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` and nothing else: closed tags, strict
JSON, ``name`` a string and ``arguments`` an object. This is how verl's and vLLM's hermes parsers
read Qwen output, kept as the baseline the benchmark compares against.
"""

from __future__ import annotations

import json
import re

from agents.parsers._common import join_content, snippet
from agents.records import ParsedToolCalls, ToolCall

_BLOCK_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse(text: str) -> ParsedToolCalls:
    """Calls from closed ``<tool_call>`` blocks; every other byte of ``text`` is content."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pieces: list[str] = []
    pos = 0
    for number, match in enumerate(_BLOCK_RE.finditer(text), start=1):
        pieces.append(text[pos : match.start()])
        pos = match.end()
        body = match.group(1)
        where = f"<tool_call> block {number}"
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as exc:
            errors.append(f"{where}: invalid JSON ({exc}): {snippet(body)}")
            continue
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments") if isinstance(value, dict) else None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            errors.append(f"{where}: expected {{\"name\": str, \"arguments\": object}}: {snippet(body)}")
            continue
        calls.append(ToolCall(name=name, arguments=arguments))
    pieces.append(text[pos:])
    return ParsedToolCalls(calls=calls, content=join_content(pieces), errors=errors)
