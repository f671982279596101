"""OpenAI stream chunks of the rollout app's ingress (deployments layer; pure functions).

- ``chat_chunks`` / ``text_chunks``: a sample's answer (as ``openai_protocol`` builds it whole) as stream chunks,
  one per sampled token; tool calls are released by the streaming parser (``agents.parsers.streaming``) once their
  block is complete, so the content and calls of the chunks, concatenated, equal the non-streamed message.
- ``usage_chunk``: the last chunk when ``stream_options.include_usage``; ``sse``: chunks as server-sent events.
"""

from __future__ import annotations

import json
from typing import Any

from agents.parsers import strip_end_markers
from agents.parsers.streaming import ToolCallStream
from deployments.openai_protocol import Sample, finish_reason, logprob_entry, openai_call, usage_counts


def _text_prefixes(ids: tuple[int, ...], tokenizer: Any, final: str, *, strip: bool) -> list[str]:
    """For each sampled token, the part of ``final`` (the answer's whole text) that is settled once that token is
    decoded: a decoded prefix that is not a prefix of ``final`` (half a UTF-8 character, text past a stop string)
    settles nothing new. The last entry is ``final``."""
    settled, out = "", []
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(list(ids[:k]), skip_special_tokens=False)
        text = strip_end_markers(text, tokenizer) if strip else text
        if final.startswith(text) and len(text) > len(settled):
            settled = text
        out.append(settled)
    if out:
        out[-1] = final
    return out


def _chunk(completion_id: str, created: int, model: str, obj: str, choice: dict[str, Any]) -> dict[str, Any]:
    return {"id": completion_id, "object": obj, "created": created, "model": model, "choices": [choice]}


def chat_chunks(*, completion_id: str, created: int, model: str, index: int, sample: Sample, message: dict[str, Any],
                tokenizer: Any, parser: str, parse_tools: bool, logprobs: bool,
                token_ids: bool, forced: bool = False) -> list[dict[str, Any]]:
    """One sample's ``chat.completion.chunk`` objects: the role, then one chunk per sampled token (its content delta,
    any tool call completed by it, its log-prob and id when asked), then the finish reason. A ``forced`` answer
    (``forced_tool_message``) streams no content: its calls come with the last token, complete JSON being known only
    then; one cut short streams as content."""
    if forced and message.get("tool_calls"):
        return _forced_chunks(completion_id, created, model, index, sample, message, tokenizer, logprobs, token_ids)
    result = sample.result
    ids = result.token_ids
    final = sample.before_stop if sample.before_stop is not None else strip_end_markers(
        tokenizer.decode(list(ids), skip_special_tokens=False), tokenizer)
    stream = ToolCallStream(parser) if parse_tools else None
    calls_sent = 0
    chunks = [_chunk(completion_id, created, model, "chat.completion.chunk",
                     {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                      "finish_reason": None})]
    sent = ""
    prefixes = _text_prefixes(ids, tokenizer, final, strip=True)
    for k, text in enumerate(prefixes):
        last = k == len(prefixes) - 1
        delta: dict[str, Any] = {}
        if stream is None:
            delta["content"] = text[len(sent):]
            sent = text
        else:
            released = [stream.feed(text)] + ([stream.finish()] if last else [])
            content = "".join(r.content for r in released)
            calls = [c for r in released for c in r.calls]
            if content:
                delta["content"] = content
            if calls:
                # the same ids as the non-streamed message when it has them (one parse of the same text)
                known = message.get("tool_calls") or []
                delta["tool_calls"] = []
                for call in calls:
                    wire = known[calls_sent] if calls_sent < len(known) else openai_call(call)
                    delta["tool_calls"].append({"index": calls_sent, **wire})
                    calls_sent += 1
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        if logprobs:
            choice["logprobs"] = {"content": [logprob_entry(ids[k], result.logprobs[k], tokenizer)]}
        if token_ids:
            choice["token_ids"] = [ids[k]]
        if delta.get("content") or delta.get("tool_calls") or logprobs or token_ids:
            chunks.append(_chunk(completion_id, created, model, "chat.completion.chunk", choice))
    chunks.append(_chunk(completion_id, created, model, "chat.completion.chunk",
                         {"index": index, "delta": {}, "logprobs": None,
                          "finish_reason": finish_reason(result, calls_sent > 0)}))
    return chunks


def _forced_chunks(completion_id: str, created: int, model: str, index: int, sample: Sample, message: dict[str, Any],
                   tokenizer: Any, logprobs: bool, token_ids: bool) -> list[dict[str, Any]]:
    ids, result = sample.result.token_ids, sample.result
    chunks = [_chunk(completion_id, created, model, "chat.completion.chunk",
                     {"index": index, "delta": {"role": "assistant", "content": None}, "logprobs": None,
                      "finish_reason": None})]
    for k, token in enumerate(ids):
        delta: dict[str, Any] = {}
        if k == len(ids) - 1:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        if logprobs:
            choice["logprobs"] = {"content": [logprob_entry(token, result.logprobs[k], tokenizer)]}
        if token_ids:
            choice["token_ids"] = [token]
        if delta or logprobs or token_ids:
            chunks.append(_chunk(completion_id, created, model, "chat.completion.chunk", choice))
    chunks.append(_chunk(completion_id, created, model, "chat.completion.chunk",
                         {"index": index, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}))
    return chunks


def text_chunks(*, completion_id: str, created: int, model: str, index: int, sample: Sample, tokenizer: Any,
                logprobs: bool, token_ids: bool) -> list[dict[str, Any]]:
    """One sample's ``text_completion`` stream chunks: one per sampled token, then the finish reason."""
    result = sample.result
    ids = result.token_ids
    final = sample.before_stop if sample.before_stop is not None else tokenizer.decode(list(ids),
                                                                                       skip_special_tokens=True)
    chunks, sent = [], ""
    for k, text in enumerate(_text_prefixes(ids, tokenizer, final, strip=False)):
        choice: dict[str, Any] = {"index": index, "text": text[len(sent):], "logprobs": None, "finish_reason": None}
        if logprobs:
            choice["logprobs"] = {"tokens": [tokenizer.decode([ids[k]], skip_special_tokens=False)],
                                  "token_logprobs": [float(result.logprobs[k])], "top_logprobs": None,
                                  "text_offset": [len(sent)]}
        sent = text
        if token_ids:
            choice["token_ids"] = [ids[k]]
        if choice["text"] or logprobs or token_ids:
            chunks.append(_chunk(completion_id, created, model, "text_completion", choice))
    chunks.append(_chunk(completion_id, created, model, "text_completion",
                         {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason(result, False)}))
    return chunks


def usage_chunk(completion_id: str, created: int, model: str, obj: str, prompt_len: int,
                samples: list[Sample]) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage of the whole request."""
    return {"id": completion_id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage_counts(prompt_len, [s.result for s in samples])}


def sse(chunks: list[dict[str, Any]]) -> str:
    """Server-sent events: one ``data:`` line per chunk, then ``[DONE]``."""
    return "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks) + "data: [DONE]\n\n"
