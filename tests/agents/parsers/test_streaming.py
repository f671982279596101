"""Streaming: what ToolCallStream releases equals the non-streaming parse, and it holds back text
only where a call may be starting."""

from __future__ import annotations

import pytest

from agents.parsers import PARSERS
from agents.parsers.streaming import ToolCallStream, hold_point
from agents.records import ToolCall
from tests.agents.parsers.golden_corpus import CORPUS


def _stream(text: str, fmt: str, chunk: int) -> tuple[str, list[ToolCall]]:
    stream = ToolCallStream(fmt)
    content, calls = "", []
    for end in [*range(chunk, len(text), chunk), len(text)]:
        delta = stream.feed(text[:end])
        content += delta.content
        calls.extend(delta.calls)
    delta = stream.finish()
    return content + delta.content, calls + list(delta.calls)


@pytest.mark.unit
@pytest.mark.parametrize("fmt", sorted(PARSERS))
@pytest.mark.parametrize("chunk", [1, 7])
def test_stream_releases_exactly_the_non_streaming_parse(fmt: str, chunk: int):
    for case in CORPUS:
        parsed = PARSERS[fmt](case.text)
        assert _stream(case.text, fmt, chunk) == (parsed.content, parsed.calls), case.case_id


@pytest.mark.unit
def test_hold_point_marks_where_a_call_may_start():
    assert hold_point("Let me check <tool_") == len("Let me check ")
    assert hold_point("Let me check <tool_call>\n{") == len("Let me check ")
    assert hold_point('Sure: {"name": "f", "argu') == len("Sure: ")
    assert hold_point("Result ``") == len("Result ")
    assert hold_point("Plain prose with {closed} braces.") == len("Plain prose with {closed} braces.")
    done = '<tool_call>{"name": "f", "arguments": {}}</tool_call> then'
    assert hold_point(done) == len(done)
    # strict formats hold only at their own marker
    assert hold_point('Sure: {"name": "f"', "hermes") == len('Sure: {"name": "f"')


@pytest.mark.unit
def test_call_is_released_when_its_block_closes_not_at_the_end():
    stream = ToolCallStream()
    first = stream.feed('Checking.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}')
    assert (first.content, first.calls) == ("Checking.", ())
    closed = stream.feed(
        'Checking.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
    )
    assert closed.calls == (ToolCall("run_sql", {"query": "SELECT 1"}),) and closed.content == ""
    assert stream.finish().calls == ()


@pytest.mark.unit
def test_unclosed_call_is_released_by_finish():
    stream = ToolCallStream()
    text = 'Checking.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 3"}}'
    assert stream.feed(text).calls == ()
    assert stream.finish().calls == (ToolCall("run_sql", {"query": "SELECT 3"}),)
    assert stream.finish().calls == ()  # a second finish releases nothing


@pytest.mark.unit
def test_stream_does_not_leak_a_closing_tag_the_parser_drops():
    # found by the fuzz test: the opener is missing, the bare call's stray "</tool_call>" is dropped
    text = 'tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
    assert _stream(text, "qwen25_coder", 1) == ("tool_call>", [ToolCall("run_sql", {"query": "SELECT 1"})])


@pytest.mark.unit
def test_stream_does_not_split_an_object_at_a_fence_inside_it():
    # found by the fuzz test: "```" inside a balanced object; the whole object is one broken call
    text = 'Next: {```"name": "calculator", "arguments": {"expression": "17 - 9"}}}'
    parsed = PARSERS["qwen25_coder"](text)
    assert (parsed.calls, parsed.content, len(parsed.errors)) == ([], "Next:", 1)
    assert _stream(text, "qwen25_coder", 1) == ("Next:", [])
