"""OpenAI request models and response builders of the rollout app's ingress (deployments layer; pure functions).

``OpenAIIngress`` validates bodies with the request models here and builds every response with the functions
here from sampled token ids, so unit tests check the wire format without a cluster.

- ``ChatCompletionRequest`` / ``CompletionRequest``: the subset of OpenAI's chat and legacy completions requests
  the server implements; anything it cannot honour (``echo``, ``top_logprobs > 0``) is a validation error, which
  the ingress answers with 400 in OpenAI's error shape.
- ``forced_tool_schema`` / ``forced_tool_message``: ``tool_choice: "required"`` or a named function as vLLM's
  OpenAI server does it: the output is constrained to a JSON schema (an array of ``{name, parameters}``, or the
  named function's arguments) and that JSON becomes ``tool_calls``. Only the vllm engine constrains decoding.
- ``apply_stop``: ``stop`` strings cut the sampled ids after the token that completes the first stop string.
- ``chat_completion`` / ``text_completion``: one response object for ``n`` samples.

The same answers as stream chunks are built in ``openai_stream``.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agents.parsers import parse_tool_calls, strip_end_markers
from agents.records import GenerateResult, ToolCall

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 8


class ErrorDetail(BaseModel):
    """OpenAI's error object: what every 4xx/5xx answer of the ingress carries under ``error``."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """The body of an error answer, ``{"error": {...}}``, as OpenAI's SDKs read it."""

    error: ErrorDetail


# The error answers each route may give, in the app's OpenAPI schema (a fuzzer checks answers against it).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "invalid request: the message names the field"},
    401: {"model": ErrorResponse, "description": "missing or wrong bearer token (serve.api_key_env)"},
}
SESSION_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 404: {"model": ErrorResponse, "description": "no calls recorded for the session"}}
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorResponse, "description": "no rollout replica of the app is running yet (its engine is still "
                                                 "being built) or none is left; ask again"}}
GENERATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 503: {"model": ErrorResponse, "description": "the engine aborted the request, or its rollout "
                                                                    "replicas died under it; retry it"}}


class SamplingRequest(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1 - MAX_N)
    """Sample ``i`` of ``n`` uses ``seed + i``; a 64-bit seed (a larger one was a 500 from the engine's generator)."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    """Samples of the one prompt, sent to one replica together (the prompt is prefilled once)."""
    stream: bool = False
    """Server-sent events, one chunk per sampled token; sent once the whole answer is sampled (the engines return
    whole answers), so the first chunk comes when the answer is done."""
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    """Up to 4 strings: the answer ends before the first one (the recorded ids end with the token that completed
    it). Applied to the decoded text after sampling: the engine's token stops are EOS only."""
    return_token_ids: bool = False
    """vLLM's extension: ``prompt_token_ids`` and each choice's ``token_ids`` in the response."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = set(value or {}) - {"include_usage", "continuous_usage_stats"}
        if unknown:
            raise ValueError(f"unknown stream_options {sorted(unknown)} (known: include_usage)")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatCompletionRequest(SamplingRequest):
    """The subset of OpenAI's chat completion request this server implements."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """``auto``, ``none``, ``required`` or ``{"type": "function", "function": {"name": ...}}``; the last two need
    constrained decoding (the vllm engine): the hf engine answers them with 400 rather than ignoring them."""
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    """Only 0: the engines return the sampled token's log-prob, not the alternatives."""

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if value in (None, "auto", "none", "required"):
            return value
        if isinstance(value, dict):
            name = (value.get("function") or {}).get("name") if value.get("type") == "function" else None
            if isinstance(name, str) and name:
                return {"type": "function", "function": {"name": name}}
            raise ValueError('a named tool_choice is {"type": "function", "function": {"name": "<tool name>"}}')
        raise ValueError(f"{value!r} is not one of 'auto', 'none', 'required' or a named function")

    @model_validator(mode="after")
    def _forced_needs_tools(self) -> ChatCompletionRequest:
        if self.forced_tool is None:
            return self
        names = [(t.get("function") or {}).get("name") for t in self.tools or ()]
        if not names:
            raise ValueError("tool_choice: forcing a tool call needs tools")
        if self.forced_tool != "required" and self.forced_tool not in names:
            raise ValueError(f"tool_choice names function {self.forced_tool!r}, which is not among the tools "
                             f"({', '.join(map(str, names))})")
        return self

    @property
    def forced_tool(self) -> str | None:
        """``"required"``, the named function's name, or None when the model decides (or may not call)."""
        if self.tool_choice == "required":
            return "required"
        if isinstance(self.tool_choice, dict):
            return self.tool_choice["function"]["name"]
        return None

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, message in enumerate(value):
            role = message.get("role")
            if role not in MESSAGE_ROLES:
                raise ValueError(f"messages[{index}].role {role!r} is not one of {', '.join(MESSAGE_ROLES)}")
            content = message.get("content")
            parts_ok = isinstance(content, list) and all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
            if not (content is None or isinstance(content, str) or parts_ok):
                raise ValueError(f"messages[{index}].content must be a string or a list of text parts, got "
                                 f"{type(content).__name__}" + (" with non-text parts" if isinstance(content, list) else ""))
            if content is None and not (role == "assistant" and message.get("tool_calls")):
                raise ValueError(f"messages[{index}]: content is required (only an assistant message with tool_calls "
                                 "may omit it)")
        return value

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(SamplingRequest):
    """The subset of OpenAI's legacy completions request: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for this endpoint
    logprobs: int | None = Field(default=None, ge=0, le=0)
    """Only 0 (the sampled tokens' log-probs): the engines do not return alternatives."""
    echo: Literal[False] = False
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError(f"one prompt per request (got {len(value)}); send each as its own request, or "
                                 "use n for several samples of one prompt")
            value = value[0]
        if isinstance(value, str) and not value:
            raise ValueError("empty prompt")
        if isinstance(value, list) and not value:
            raise ValueError("empty list of prompt token ids")
        return value


@dataclass(frozen=True)
class Sample:
    """One sampled answer after ``stop`` was applied: the result (ids cut at the stop) and the text before the stop
    string (None when no stop string occurred)."""

    result: GenerateResult
    before_stop: str | None = None


def apply_stop(ids: tuple[int, ...], logprobs: tuple[float, ...], tokenizer: Any,
               stops: list[str]) -> tuple[tuple[int, ...], tuple[float, ...], str | None]:
    """The sampled ids up to the token that completes the first stop string (all of them when none occurs), their
    log-probs, and the text before that stop (None: no stop occurred)."""
    if not stops:
        return ids, logprobs, None
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return ids, logprobs, None
    at = min(position for position, _ in hits)
    # the shortest prefix of tokens whose text reaches past the first stop string: bisect on the prefix length
    # (text grows with the prefix), one decode per probe
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        prefix = tokenizer.decode(list(ids[:mid]), skip_special_tokens=False)
        if any(s in prefix for s in stops):
            high = mid
        else:
            low = mid + 1
    return ids[:low], logprobs[:low], text[:at]


def logprob_entry(token_id: int, logprob: float, tokenizer: Any) -> dict[str, Any]:
    """One token of OpenAI's ``logprobs.content``: its text, log-prob and UTF-8 bytes (no ``top_logprobs``)."""
    token = tokenizer.decode([token_id], skip_special_tokens=False)
    return {"token": token, "logprob": float(logprob), "bytes": list(token.encode("utf-8")), "top_logprobs": []}


def logprobs_content(ids: tuple[int, ...], logprobs: tuple[float, ...], tokenizer: Any) -> dict[str, Any]:
    """OpenAI's ``choices[].logprobs``: each sampled token, its log-prob and bytes (no alternatives)."""
    return {"content": [logprob_entry(t, lp, tokenizer) for t, lp in zip(ids, logprobs)]}


def flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI content-part lists (``[{"type": "text", "text": ...}]``) as one string, as templates expect."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return {**message, "content": text}
    return message


def openai_call(call: Any) -> dict[str, Any]:
    """A parsed tool call as an OpenAI ``tool_calls`` entry: arguments as a JSON string, an id made when it has none."""
    return {"id": call.id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def completion_message(
    response_ids: tuple[int, ...] | list[int], tokenizer: Any, parser: str, parse_tools: bool
) -> dict[str, Any]:
    """The assistant message for sampled ids: content, plus ``tool_calls`` when the parser finds calls."""
    text = strip_end_markers(tokenizer.decode(list(response_ids), skip_special_tokens=False), tokenizer)
    if not parse_tools:
        return {"role": "assistant", "content": text}
    parsed = parse_tool_calls(text, parser)
    if not parsed.calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": parsed.content.strip() or None,
            "tool_calls": [openai_call(call) for call in parsed.calls]}


def sample_message(sample: Sample, tokenizer: Any, parser: str, parse_tools: bool) -> dict[str, Any]:
    """``completion_message`` of a sample; after a stop string the content is the text before it."""
    message = completion_message(sample.result.token_ids, tokenizer, parser, parse_tools)
    if sample.before_stop is not None and not message.get("tool_calls"):
        return {"role": "assistant", "content": sample.before_stop}
    return message


def forced_tool_schema(forced: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema a forced tool call is decoded under (vLLM's server uses the same two shapes): for
    ``required`` an array of one or more ``{"name": <a tool>, "parameters": <its schema>}``; for a named function
    its parameters object."""
    functions = [t.get("function") or {} for t in tools]
    params = {f.get("name"): f.get("parameters") or {"type": "object"} for f in functions}
    if forced != "required":
        return params[forced]
    return {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema},
         "required": ["name", "parameters"]} for name, schema in params.items()]}}


def forced_tool_message(sample: Sample, tokenizer: Any, forced: str) -> dict[str, Any]:
    """The assistant message of an answer decoded under ``forced_tool_schema``: its JSON as ``tool_calls``. An answer
    cut short (``max_tokens``) is not complete JSON: it comes back as content, with no call."""
    text = strip_end_markers(tokenizer.decode(list(sample.result.token_ids), skip_special_tokens=False), tokenizer)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {"role": "assistant", "content": text}
    try:  # the schema guarantees this shape for complete output
        calls = ([ToolCall(c["name"], c["parameters"]) for c in value] if forced == "required"
                 else [ToolCall(forced, value)])
    except (KeyError, TypeError, ValueError):
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": None, "tool_calls": [openai_call(call) for call in calls]}


def finish_reason(result: GenerateResult, has_calls: bool) -> str:
    """OpenAI's ``finish_reason``: ``tool_calls`` when the sample calls tools, ``length`` if cut off, else ``stop``."""
    if has_calls:
        return "tool_calls"
    return "length" if result.finish_reason == "length" else "stop"


def usage_counts(prompt_len: int, samples: list[GenerateResult]) -> dict[str, int]:
    """OpenAI's ``usage``: the prompt counted once, completion tokens summed over every sample (``n``)."""
    completion_tokens = sum(len(r.token_ids) for r in samples)
    return {"prompt_tokens": prompt_len, "completion_tokens": completion_tokens,
            "total_tokens": prompt_len + completion_tokens}


def build_chat_completion(
    *,
    completion_id: str,
    model: str,
    prompt_len: int,
    answers: list[tuple[GenerateResult, dict[str, Any]]],
    created: int | None = None,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object: one choice per (result, message)."""
    choices = [{"index": i, "message": message, "finish_reason": finish_reason(result, bool(message.get("tool_calls"))),
                "logprobs": None} for i, (result, message) in enumerate(answers)]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": choices,
        "usage": usage_counts(prompt_len, [result for result, _ in answers]),
        "system_fingerprint": f"policy-v{min(result.policy_version for result, _ in answers)}",
    }


def text_completion(*, completion_id: str, model: str, prompt_len: int, samples: list[Sample], tokenizer: Any,
                    logprobs: bool, created: int | None = None) -> dict[str, Any]:
    """An OpenAI ``text_completion`` object: one choice per sample (legacy ``logprobs`` layout when asked)."""
    choices = []
    for i, sample in enumerate(samples):
        result = sample.result
        text = sample.before_stop if sample.before_stop is not None else tokenizer.decode(
            list(result.token_ids), skip_special_tokens=True)
        choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None,
                                  "finish_reason": finish_reason(result, False)}
        if logprobs:
            tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in result.token_ids]
            offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:len(tokens)]
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": [float(x) for x in result.logprobs],
                                  "top_logprobs": None, "text_offset": offsets}
        choices.append(choice)
    return {"id": completion_id, "object": "text_completion",
            "created": int(time.time()) if created is None else created, "model": model, "choices": choices,
            "usage": usage_counts(prompt_len, [s.result for s in samples]),
            "system_fingerprint": f"policy-v{min(s.result.policy_version for s in samples)}"}
