"""Incremental tool-call parsing of streamed text (agents layer: pure Python).

A server streams a model's text one delta at a time. ``ToolCallStream`` decides what may be sent:
content is released as it arrives until a call may be starting (a ``<tool_call>`` or ``<tools>``
opener, a code fence, an unclosed ``{``, or a prefix of one of these at the very end); from there
text is held back until the block completes, then its calls are released, or until ``finish``.

What it releases, concatenated, equals the non-streaming parse of the whole text: the same calls in
the same order and the same content. The vLLM adapter in ``vllm_plugin`` is a thin shell over it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.parsers import DEFAULT_FORMAT, get_parser, parse_tool_calls
from agents.parsers.qwen25_coder import BareScan
from agents.records import ParsedToolCalls, ToolCall


@dataclass(frozen=True)
class StreamDelta:
    """What became safe to send after one step: new content and newly completed calls."""

    content: str = ""
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class _HoldRule:
    """Where a format's calls can start. ``closed`` matches complete blocks (never held);
    ``tail_markers`` are also held while only a prefix of them ends the text."""

    markers: tuple[str, ...]
    closed: re.Pattern[str]
    bare_json: bool
    tail_markers: tuple[str, ...] = ()


_TAG_BLOCK = r"<tool_call>.*?</tool_call>"
_HOLD_RULES: dict[str, _HoldRule] = {
    "hermes": _HoldRule(("<tool_call>",), re.compile(_TAG_BLOCK, re.DOTALL), bare_json=False),
    "qwen3_xml": _HoldRule(("<tool_call>",), re.compile(_TAG_BLOCK, re.DOTALL), bare_json=False),
    "qwen25_coder": _HoldRule(
        ("<tool_call>", "<tools>", "```"),
        re.compile(r"```(?:[A-Za-z][\w+\-]*)?[ \t]*\n?.*?```|" + _TAG_BLOCK + r"|<tools>.*?</tools>", re.DOTALL),
        bare_json=True,
        # the parser drops a closing tag left behind a bare call; it must not leak out half-written
        tail_markers=("</tool_call>", "</tools>"),
    ),
}
# Text without any of these is prose to every parser: no markers, no JSON.
_SYNTAX_CHARS = ("{", "[", "<", "`")


def hold_point(text: str, fmt: str = DEFAULT_FORMAT) -> int:
    """Index from which ``text`` may still turn into a call; ``len(text)`` when nothing is pending."""
    return _scan(text, _HOLD_RULES[fmt])[0]


def _scan(text: str, rule: _HoldRule, bare: BareScan | None = None) -> tuple[int, int, BareScan | None]:
    """(hold point, end of the last complete block before it (0 if none), the bare JSON walk over the text from
    there to the hold point when the rule has one). ``bare``, a walk over ``text`` from earlier calls on a shorter
    ``text``, goes on from where it stopped when ``text`` has no complete block."""
    pos = 0
    # str.find first: the block regex costs far more, and most deltas carry plain prose.
    blocks = rule.closed.finditer(text) if any(marker in text for marker in rule.markers) else ()
    for block in blocks:
        gap = text[pos : block.start()]
        hold, _ = _hold_in_gap(gap, rule, None)
        if hold is not None:
            return pos + hold, pos, None
        pos = block.end()
    tail = text[pos:]
    hold, walk = _hold_in_gap(tail, rule, bare if pos == 0 else None)
    if hold is None:
        hold = _partial_marker_start(tail, rule.markers + rule.tail_markers)
    return pos + hold, pos, walk


def _hold_in_gap(gap: str, rule: _HoldRule, bare: BareScan | None) -> tuple[int | None, BareScan | None]:
    """Where a call may start in ``gap`` (None: nowhere), and the bare JSON walk that read it up to there.

    A marker inside a balanced object (``{```"name": ...}``) must not split it: the parser reads the whole object as
    one candidate, so the hold moves back to the start of a candidate that is unclosed or closes past the marker."""
    hold = min((i for i in (gap.find(marker) for marker in rule.markers) if i != -1), default=len(gap))
    walk = None
    if rule.bare_json:
        walk = bare if bare is not None else BareScan()
        hold = walk.advance(gap, hold)
    return (None if hold == len(gap) else hold), walk


def _partial_marker_start(text: str, markers: tuple[str, ...]) -> int:
    """Start of a proper prefix of a marker that ``text`` ends with (``"<tool_"``, ``"``"``)."""
    start = len(text)
    for marker in markers:
        for size in range(len(marker) - 1, 0, -1):
            if text.endswith(marker[:size]):
                start = min(start, len(text) - size)
                break
    return start


def _join(before: str, after: str) -> str:
    # join_content over two runs of pieces equals joining their two joined contents by a newline
    return f"{before}\n{after}" if before and after else before or after


class ToolCallStream:
    """Per-request streaming state: feed the whole text so far, get what is safe to send.

    Text up to the end of the last complete block (``_base``) is parsed once and kept as its
    content and calls: the parsers read blocks independently, so what follows cannot change it.
    Each step then looks only at the text after it, and for ``qwen25_coder`` the walk that reads bare JSON there
    (``qwen25_coder.BareScan``) is kept from step to step: each object is read once, not once per step (a
    21k-character answer with 400 JSON objects fed 4 characters at a time: 18.1 s of parsing when every step read them
    all again, 0.28 s with the walk kept).
    """

    def __init__(self, fmt: str = DEFAULT_FORMAT) -> None:
        self._parse = get_parser(fmt)
        self._rule = _HOLD_RULES[fmt]
        self._fmt = fmt
        self._text = ""
        self._base = 0
        self._base_content = ""
        self._base_calls: list[ToolCall] = []
        self._stable_end = -1
        self._bare = BareScan() if self._rule.bare_json else None  # the bare JSON walk over the text from _base
        self._sent_content = ""
        self._sent_calls = 0
        self.finished = False

    def feed(self, current_text: str) -> StreamDelta:
        """Release what ``current_text`` (all text so far) makes final."""
        if self._bare is not None and not current_text.startswith(self._text):
            self._bare = BareScan()  # the text was rewritten, not extended: walk it again
        self._text = current_text
        tail = current_text[self._base :]
        hold, last_block_end, walk = _scan(tail, self._rule, self._bare)
        if self._base + hold == self._stable_end:
            return StreamDelta()  # still inside the same held-back block: nothing new is final
        self._stable_end = self._base + hold
        if last_block_end:
            done = self._parse(tail[:last_block_end])
            self._base += last_block_end
            self._base_content = _join(self._base_content, done.content)
            self._base_calls.extend(done.calls)
            tail, hold = tail[last_block_end:], hold - last_block_end
            if self._bare is not None:
                self._bare = walk or BareScan()  # a walk over the new tail, if the scan went that far
        # the walk has read the tail up to the hold point: what the parser makes of it, without parsing it again
        parsed = walk.parsed(tail, hold) if walk is not None and walk is self._bare else self._parse_plain(tail[:hold])
        return self._release(_join(self._base_content, parsed.content), self._base_calls + parsed.calls)

    def finish(self) -> StreamDelta:
        """End of generation: release everything still held (malformed blocks are logged once)."""
        if self.finished:
            return StreamDelta()
        self.finished = True
        parsed = parse_tool_calls(self._text, self._fmt)
        return self._release(parsed.content, parsed.calls)

    def _parse_plain(self, text: str) -> ParsedToolCalls:
        if any(char in text for char in _SYNTAX_CHARS):
            return self._parse(text)
        return ParsedToolCalls(content=text.strip())  # prose: what every parser returns for it

    def _release(self, content: str, calls: list[ToolCall]) -> StreamDelta:
        new_calls = tuple(calls[self._sent_calls :])
        self._sent_calls += len(new_calls)
        new_content = ""
        # Content of a longer prefix extends the content already sent; if a rare rewrite breaks
        # that, send nothing rather than duplicate text (finish() re-checks against the full parse).
        if content.startswith(self._sent_content):
            new_content = content[len(self._sent_content) :]
            self._sent_content = content
        return StreamDelta(content=new_content, calls=new_calls)
