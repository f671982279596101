"""Tool-call parsers (agents layer: pure Python; importing this never imports vLLM).

One module per format and one explicit table of them, ``PARSERS``. ``parse_tool_calls`` is the
entry point: it returns a ``ParsedToolCalls`` (calls, leftover content, errors) for any string and
logs each malformed block as ``Failed to decode tool call: <reason>`` (the line verl users grep for):
the first ``WARN_FIRST`` of a process at WARNING, later ones at DEBUG, because a model early in training
writes thousands of them. The agent loop counts ``errors`` as a metric (``tool_parse_errors/sum``) and
feeds them back to the model.

``parse_tool_call_ids`` is the same on tokens: the agent loop works on ``response_ids`` and never
re-tokenizes, so the text is decoded here, keeping special tokens (call markers may be special).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from agents.parsers import hermes, qwen3_xml, qwen25_coder
from agents.records import ParsedToolCalls

logger = logging.getLogger(__name__)

ParserFormat = Literal["hermes", "qwen25_coder", "qwen3_xml"]

PARSERS: dict[str, Callable[[str], ParsedToolCalls]] = {
    "hermes": hermes.parse,  # strict <tool_call>{json}</tool_call>, the verl/vLLM baseline
    "qwen25_coder": qwen25_coder.parse,  # universal: hermes, <tools>, fences, bare JSON, qwen3 XML
    "qwen3_xml": qwen3_xml.parse,  # strict <tool_call><function=..><parameter=..>
}

DEFAULT_FORMAT: ParserFormat = "qwen25_coder"

# Turn-end markers that decoding with special tokens kept; they are framing, not content.
_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")


class TokenDecoder(Protocol):
    """The slice of a Hugging Face tokenizer the token-level wrapper needs."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def get_parser(fmt: str) -> Callable[[str], ParsedToolCalls]:
    """The parse function of ``fmt``; an unknown name is a config error and raises."""
    try:
        return PARSERS[fmt]
    except KeyError:
        raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {sorted(PARSERS)}") from None


WARN_FIRST = 5
_logged = [0]  # malformed blocks logged by this process


def parse_tool_calls(text: str, fmt: str = DEFAULT_FORMAT) -> ParsedToolCalls:
    """Calls, content and errors in one model output. Never raises on a string."""
    parsed = get_parser(fmt)(text)
    for error in parsed.errors:
        _logged[0] += 1
        if _logged[0] < WARN_FIRST:
            logger.warning("Failed to decode tool call: %s", error)
        elif _logged[0] == WARN_FIRST:
            logger.warning("Failed to decode tool call: %s (further ones are logged at DEBUG level; the "
                           "tool_parse_errors/sum metric counts them all)", error)
        else:
            logger.debug("Failed to decode tool call: %s", error)
    return parsed


def parse_tool_call_ids(
    response_ids: Sequence[int], tokenizer: TokenDecoder, fmt: str = DEFAULT_FORMAT
) -> ParsedToolCalls:
    """``parse_tool_calls`` on generated token ids, decoded with special tokens kept."""
    text = tokenizer.decode(list(response_ids), skip_special_tokens=False)
    return parse_tool_calls(strip_end_markers(text, tokenizer), fmt)


def strip_end_markers(text: str, tokenizer: object = None) -> str:
    """``text`` without the end-of-turn tokens it ends with (EOS, ``<|im_end|>``, padding)."""
    markers = set(_END_MARKERS)
    for attr in ("eos_token", "pad_token"):
        token = getattr(tokenizer, attr, None)
        if isinstance(token, str) and token:
            markers.add(token)
    stripped = text.rstrip()
    while True:
        for marker in markers:
            if stripped.endswith(marker):
                stripped = stripped[: -len(marker)].rstrip()
                break
        else:
            return stripped


__all__ = [
    "DEFAULT_FORMAT",
    "PARSERS",
    "ParserFormat",
    "get_parser",
    "parse_tool_call_ids",
    "parse_tool_calls",
    "strip_end_markers",
]
