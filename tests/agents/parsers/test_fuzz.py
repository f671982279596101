"""Fuzz: no parser raises on any string, random or a mutated golden output, and calls stay typed."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agents.parsers import PARSERS, qwen25_coder
from agents.parsers.qwen25_coder import BareScan
from agents.parsers.streaming import ToolCallStream
from agents.records import ParsedToolCalls
from tests.agents.parsers.golden_corpus import CORPUS

# Pieces of call syntax, so random strings reach the parsers' deeper branches.
SYNTAX = [
    "{", "}", "[", "]", '"', "'", ":", ",", "\\", "\n", " ", "`", "```", "```json\n", "```python\n",
    "<tool_call>", "</tool_call>", "<tools>", "</tools>", "<function=f>", "</function>",
    "<parameter=p>", "</parameter>", '"name"', '"arguments"', '"parameters"', '"function"',
    '"tool_calls"', '"type"', "'name'", "true", "None", "1e999", "NaN", "run_sql",
]
syntax_text = st.lists(st.one_of(st.sampled_from(SYNTAX), st.text(max_size=3)), max_size=40).map("".join)
corpus_text = st.sampled_from([case.text for case in CORPUS])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(corpus_text)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["cut", "drop", "insert", "truncate"]))
        if op == "truncate":
            text = text[:at]
        elif op == "drop":
            text = text[:at] + text[at + draw(st.integers(1, 5)) :]
        else:
            piece = draw(st.sampled_from(SYNTAX)) if op == "insert" else draw(corpus_text)
            text = text[:at] + piece + text[at:]
    return text


# Several outputs in a row: the stream commits text block by block, so long mixed texts matter.
several = st.lists(mutated(), min_size=2, max_size=4).map("\n".join)


def _check(text: str) -> None:
    for fmt, parse in PARSERS.items():
        parsed = parse(text)
        assert isinstance(parsed, ParsedToolCalls), fmt
        assert all(isinstance(call.arguments, dict) and call.name for call in parsed.calls), fmt
        assert all(isinstance(error, str) and error for error in parsed.errors), fmt


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), syntax_text))
def test_parsers_never_raise_on_random_strings(text: str):
    _check(text)


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(mutated())
def test_parsers_never_raise_on_mutated_outputs(text: str):
    _check(text)


@pytest.mark.unit
@pytest.mark.parametrize("fmt", sorted(PARSERS))
@settings(max_examples=50, deadline=None)
@given(text=st.one_of(mutated(), syntax_text, several), chunk=st.integers(1, 9))
# found by this test on a fresh clone: a balanced object the parser cannot decode, with an unterminated call inside it
@example(text='</tool_call>Computing now. {"name": "calculator"}, "arguments": {"expression": "123 * 45\n[{name": '
         '"calculator", "arguments": {"expression": "5 * 6"}}, {"name": "calculator", "arguments": {"expression": "30"}}]',
         chunk=1)
def test_stream_never_raises_and_releases_the_full_parse(fmt: str, text: str, chunk: int):
    stream = ToolCallStream(fmt)
    content, calls = "", []
    for end in [*range(chunk, len(text), chunk), len(text)]:
        delta = stream.feed(text[:end])
        content, calls = content + delta.content, calls + list(delta.calls)
    delta = stream.finish()
    full = PARSERS[fmt](text)
    assert (content + delta.content, calls + list(delta.calls)) == (full.content, full.calls)


def _without_markers(text: str) -> str:
    while "```" in text or "<tool" in text:
        text = text.replace("```", "").replace("<tool", "")
    return text


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(text=st.one_of(mutated(), syntax_text, several).map(_without_markers), chunk=st.integers(1, 9))
def test_a_bare_json_walk_kept_across_a_growing_text_reads_it_as_the_parser(text: str, chunk: int):
    """One ``BareScan`` advanced over longer and longer prefixes: at each, what it holds back and releases is the
    parse of the text before its hold point; at the end it is the parse of the whole text."""
    walk = BareScan()
    for end in [*range(chunk, len(text), chunk), len(text)]:
        hold = walk.advance(text[:end])
        released, truncated = walk.parsed(text[:end], hold), qwen25_coder.parse(text[:hold])
        assert (released.content, released.calls) == (truncated.content, truncated.calls), end
    walk.advance(text, final=True)
    whole, full = walk.parsed(text, len(text)), qwen25_coder.parse(text)
    assert (whole.content, whole.calls, whole.errors) == (full.content, full.calls, full.errors)
