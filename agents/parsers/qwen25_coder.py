"""Universal tool-call parser for Qwen2.5-Coder and friends (agents layer: pure Python).

Qwen2.5-Coder rarely writes the hermes form it was prompted with: it writes ``<tools>`` tags,
fenced JSON, bare JSON after some prose, OpenAI-shaped objects, Python dicts. This parser accepts
all of them, plus hermes and the Qwen3 XML form, so one setting serves every model we know of.

It reads ``text`` as a sequence of segments: code fences, ``<tool_call>``/``<tools>`` blocks, an
unclosed ``<tool_call>`` at the end, and the plain text between them, where bare JSON is looked for.
Markers only a call uses make a block explicit (undecodable means error); fenced ``json`` and bare
JSON are implicit (only an unmistakable call shape is a call, see ``_common``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agents.parsers._common import (
    BracketWalk,
    CallDecodeError,
    calls_from_value,
    decode_lenient,
    join_content,
    looks_like_call,
    snippet,
)
from agents.parsers.qwen3_xml import parse_xml_call
from agents.records import ParsedToolCalls, ToolCall

_SEGMENT_RE = re.compile(
    r"(?P<fence>```(?P<lang>[A-Za-z][\w+\-]*)?[ \t]*\n?(?P<fence_body>.*?)```)"
    r"|<tool_call>(?P<tag>.*?)</tool_call>"
    r"|<tools>(?P<tools>.*?)</tools>"
    r"|<tool_call>(?P<open>.*)\Z",
    re.DOTALL,
)
_FENCED_BODY_RE = re.compile(r"\s*```(?:[A-Za-z][\w+\-]*)?[ \t]*\n?(.*?)```\s*\Z", re.DOTALL)
_TOOL_FENCE_LANGS = frozenset({"tool_call", "tool_calls", "tools"})
_JSON_FENCE_LANGS = frozenset({"", "json", "json5", "jsonc"})
# Bare JSON starts at "{" or at a list of objects; "[1, 2]" in prose is never a call.
_BARE_START_RE = re.compile(r"\{|\[\s*\{")
# What models leave behind a bare call: a stray "}" or a closing tag whose opener they forgot.
_TRAILING_JUNK_RE = re.compile(r"(?:\s*\})*(?:\s*</tool_call>|\s*</tools>)?")
_CLOSING_TAGS = ("</tool_call>", "</tools>")
_LONGEST_TAG = max(map(len, _CLOSING_TAGS))
_SPACE_RE = re.compile(r"\s*")
# A "[" that ends a stream's text may open a list of calls.
_OPEN_LIST_AT_END_RE = re.compile(r"\[\s*\Z")
# Each bare candidate costs a scan to its closing bracket; bounding them keeps a brace-heavy
# output (code, LaTeX) linear. Real outputs have a handful.
_MAX_BARE_CANDIDATES = 256


@dataclass
class _Collector:
    """Calls, errors and content pieces gathered while walking one output, in order."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    explicit_blocks: int = 0


def parse(text: str) -> ParsedToolCalls:
    """Every call the model plainly meant; the rest of ``text`` is content."""
    found = _Collector()
    _parse_region(text, found)
    return ParsedToolCalls(calls=found.calls, content=join_content(found.pieces), errors=found.errors)


def _parse_region(text: str, found: _Collector) -> None:
    if "```" not in text and "<tool" not in text:
        _scan_bare(text, found)  # most text has no markers; str.find is far cheaper than the regex
        return
    pos = 0
    for match in _SEGMENT_RE.finditer(text):
        _scan_bare(text[pos : match.start()], found)
        pos = match.end()
        if match.group("fence") is not None:
            _fence(match, found)
        elif match.group("tag") is not None:
            _explicit(match.group("tag"), "<tool_call> block", found)
        elif match.group("tools") is not None:
            _explicit(match.group("tools"), "<tools> block", found)
        else:
            _unclosed(match.group("open"), found)
    _scan_bare(text[pos:], found)


def _explicit_calls(body: str) -> list[ToolCall]:
    """The calls in the body of an explicit block; raises CallDecodeError when there are none."""
    fenced = _FENCED_BODY_RE.match(body)
    inner = fenced.group(1) if fenced else body
    if inner.lstrip().startswith("<function="):
        return [parse_xml_call(inner)]
    calls = calls_from_value(decode_lenient(inner), explicit=True)
    if calls is None:
        raise CallDecodeError(f"not a tool call (no name with arguments): {snippet(inner)}")
    return calls


def _explicit(body: str, kind: str, found: _Collector) -> None:
    # A model that forgot one closing tag writes "<tool_call>{a}<tool_call>{b}</tool_call>".
    for part in body.split("<tool_call>"):
        if not part.strip() and "<tool_call>" in body:
            continue
        found.explicit_blocks += 1
        try:
            found.calls.extend(_explicit_calls(part))
        except CallDecodeError as exc:
            found.errors.append(f"{kind} {found.explicit_blocks}: {exc}")


def _unclosed(body: str, found: _Collector) -> None:
    """A ``<tool_call>`` the generation never closed (stop string, EOS or length)."""
    found.explicit_blocks += 1
    try:
        found.calls.extend(_explicit_calls(body))
        return
    except CallDecodeError as exc:
        first_error = exc
    # The call may be followed by prose the model wrote instead of the closing tag.
    trailing = _Collector()
    _scan_bare(body, trailing)
    if trailing.calls and not trailing.errors:
        found.calls.extend(trailing.calls)
        found.pieces.extend(trailing.pieces)
        return
    found.errors.append(f"unclosed <tool_call> block {found.explicit_blocks}: {first_error}")


def _fence(match: re.Match[str], found: _Collector) -> None:
    lang = (match.group("lang") or "").lower()
    body = match.group("fence_body")
    if lang in _TOOL_FENCE_LANGS:
        _explicit(body, f"```{lang} block", found)
        return
    if lang not in _JSON_FENCE_LANGS:
        found.pieces.append(match.group(0))  # code in another language is content, whatever it holds
        return
    if "<tool_call>" in body or "<tools>" in body:
        _parse_region(body, found)
        return
    try:
        calls = calls_from_value(decode_lenient(body), explicit=False)
    except CallDecodeError as exc:
        if body.lstrip()[:1] in ("{", "[") and looks_like_call(body):
            found.errors.append(f"```{lang or 'plain'} block: {exc}")
        else:
            found.pieces.append(match.group(0))
        return
    if calls is None:
        found.pieces.append(match.group(0))  # fenced JSON that is an answer, not a call
    else:
        found.calls.extend(calls)


def read_bare(fragment: str) -> tuple[list[ToolCall] | None, str | None] | None:
    """How a balanced bare JSON candidate is read: None when it does not decode and does not look like a call (the
    scan goes on inside it); else (calls, None), (None, None) for an answer object, or (None, error) for a broken
    call, each taking the candidate whole. ``streaming`` asks the same to know what it may release."""
    try:
        calls = calls_from_value(decode_lenient(fragment), explicit=False)
    except CallDecodeError as exc:
        return (None, f"bare JSON tool call: {exc}") if looks_like_call(fragment) else None
    return calls, None


def _scan_bare(gap: str, found: _Collector) -> None:
    """Bare JSON calls in plain text; everything else in ``gap`` is content."""
    if "{" not in gap:
        found.pieces.append(gap)
        return
    scan = BareScan(found)
    scan.advance(gap, final=True)
    found.pieces.append(gap[scan.pos :])


class BareScan:
    """The walk over plain text that finds bare JSON calls, kept between calls on a text that grows (a stream).

    ``advance(gap, limit)`` walks ``gap`` (the text given before, made longer) from where the last call stopped, as
    far as complete candidates decide, and returns the hold point: the start of the first candidate whose reading
    still depends on text not there yet (unclosed, or closing past ``limit``, where the caller holds a marker), or
    ``limit`` when nothing before it is pending. A call whose trailing junk may still grow holds from its end.
    Each candidate is read once however many times ``advance`` is called. With ``final=True`` the text is complete
    and the walk is the parser's own (``_scan_bare``). ``parsed(gap, hold)`` is what the parser makes of
    ``gap[:hold]``: ``ToolCallStream`` releases it without parsing the text again.
    """

    def __init__(self, found: _Collector | None = None):
        self.found = found if found is not None else _Collector()
        self.pos = 0  # start of the text not yet given to content
        self._search_at = 0  # where the next candidate is looked for
        self._used = 0  # candidates read, against _MAX_BARE_CANDIDATES
        self._open: BracketWalk | None = None  # the candidate being read, when its end was not there yet
        self._junk_from: int | None = None  # the end of a call whose trailing junk may still grow
        self._done = False

    def advance(self, gap: str, limit: int | None = None, *, final: bool = False) -> int:
        limit = len(gap) if limit is None else limit
        if self._done or (self._junk_from is not None and not self._skip_junk(gap, final)):
            return limit if self._done else self._junk_from
        found = self.found
        while self._used < _MAX_BARE_CANDIDATES:
            if self._open is None:
                match = _BARE_START_RE.search(gap, self._search_at)
                if match is None or match.start() >= limit:
                    opening = None if final or match else _OPEN_LIST_AT_END_RE.search(gap, self._search_at)
                    return opening.start() if opening and opening.start() < limit else limit
                self._open = BracketWalk(match.start())
            start = self._open.start
            end = self._open.advance(gap)
            if end is None and not final or end is not None and end > limit:
                return start  # may close later, or closes inside what the caller holds
            self._open = None
            self._used += 1
            if end is None:
                if looks_like_call(gap[start:]):  # generation stopped inside a call
                    found.pieces.append(gap[self.pos : start])
                    found.errors.append(f"unterminated JSON tool call: {snippet(gap[start:])}")
                    self.pos, self._done = len(gap), True
                    return limit
                self._search_at = start + 1
                continue
            read = read_bare(gap[start:end])
            if read is None:
                self._search_at = start + 1
                continue
            calls, error = read
            if error is not None:
                found.errors.append(error)
            elif calls is None:
                self._search_at = end  # an answer object: its insides are not calls either
                continue
            else:
                found.calls.extend(calls)
            found.pieces.append(gap[self.pos : start])
            self.pos = self._junk_from = end
            if not self._skip_junk(gap, final):
                return end
        return limit

    def _skip_junk(self, gap: str, final: bool) -> bool:
        """Step over what a model leaves behind a call; False (and nothing moved) while more of it may follow."""
        junk = _TRAILING_JUNK_RE.match(gap, self._junk_from)
        if not final and "</" not in junk.group():
            rest = _SPACE_RE.match(gap, junk.end()).end()  # a closing tag, or a part of one, may follow
            if len(gap) - rest < _LONGEST_TAG and any(tag.startswith(gap[rest:]) for tag in _CLOSING_TAGS):
                return False
        self.pos = self._search_at = junk.end()
        self._junk_from = None
        return True

    def parsed(self, gap: str, hold: int) -> ParsedToolCalls:
        pieces = [*self.found.pieces, gap[self.pos : hold]]
        found = self.found
        return ParsedToolCalls(calls=list(found.calls), content=join_content(pieces), errors=list(found.errors))
