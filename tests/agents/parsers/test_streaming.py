"""Streaming: what ToolCallStream releases equals the non-streaming parse, and it holds back text
only where a call may be starting."""

from __future__ import annotations

import pytest

from agents.parsers import PARSERS, qwen25_coder
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


@pytest.mark.unit
def test_a_long_stream_reads_each_bare_json_object_once(monkeypatch):
    """The stream keeps its bare JSON walk from feed to feed: 100 objects streamed four characters at a time are
    read once each by the stream and once more by ``finish``'s full parse (every feed used to read them all again)."""
    reads = []
    read_bare = qwen25_coder.read_bare
    monkeypatch.setattr(qwen25_coder, "read_bare", lambda fragment: reads.append(fragment) or read_bare(fragment))
    call = '{"name": "calculator", "arguments": {"expression": "6 * 7"}}'
    text = "".join(f'step {i}: {{"lr": 0.{i}, "layers": [1, 2]}} then {call}\n' for i in range(50))
    content, calls = _stream(text, "qwen25_coder", 4)
    parsed = qwen25_coder.parse(text)
    assert (content, calls) == (parsed.content, parsed.calls) and len(calls) == 50
    assert len(reads) == 2 * 100 + 100  # the stream, finish, and the parse above
