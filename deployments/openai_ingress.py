"""OpenAI-compatible HTTP ingress of the rollout app (deployments layer).

``POST /v1/chat/completions`` renders the messages (and tool schemas) with the tokenizer's chat template,
calls ``RolloutServer.generate`` token-in/token-out through its handle (the session id is the trajectory
id, so one agent session stays on one replica), decodes the sampled ids and parses tool calls with the
configured parser into OpenAI ``tool_calls``. Each call's exact tokens, log-probs and policy version are
kept under the request's ``x-session-id`` header, so a trainer can collect token-exact trajectories from any
agent framework that speaks OpenAI (the Agent Lightning pattern): ``GET /v1/sessions/{id}`` reads them,
the handle method ``pop_session(id)`` reads and drops them. Sessions live in the ingress replica's memory:
the ingress runs as one replica.

The response is built by plain functions (``completion_message``, ``build_chat_completion``) that unit
tests call with given token ids.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the real request-model classes on the
# route signatures (Serve's ingress wrapper cannot resolve string annotations, and the body became a query).
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Any, Literal

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, field_validator
from ray import serve
from ray.serve.handle import DeploymentHandle

from agents.loops.session_merge import SessionCall
from agents.parsers import parse_tool_calls, strip_end_markers
from agents.records import GenerateRequest, GenerateResult, SamplingParams
from deployments.engines.base import PromptTooLong

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
MAX_SESSIONS = 10_000  # oldest sessions are dropped first when a trainer never collects them
SESSION_HEADER = "x-session-id"


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat completion request this server implements."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    n: Literal[1] = 1
    stream: Literal[False] = False
    stop: str | list[str] | None = None
    """Up to 4 strings: the answer ends before the first one (the recorded ids end with the token that completed
    it). Applied to the decoded text after sampling: the engine's token stops are EOS only."""
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    """Only 0: the engines return the sampled token's log-prob, not the alternatives."""
    return_token_ids: bool = False
    """vLLM's extension: ``prompt_token_ids`` and each choice's ``token_ids`` in the response."""

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return stops

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


MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool")


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
    for k in range(1, len(ids) + 1):  # the shortest prefix of tokens whose text holds a stop string
        if any(s in tokenizer.decode(list(ids[:k]), skip_special_tokens=False) for s in stops):
            return ids[:k], logprobs[:k], text[:at]
    return ids, logprobs, text[:at]


def logprobs_content(ids: tuple[int, ...], logprobs: tuple[float, ...], tokenizer: Any) -> dict[str, Any]:
    """OpenAI's ``choices[].logprobs``: each sampled token, its log-prob and bytes (no alternatives)."""
    content = []
    for token_id, logprob in zip(ids, logprobs):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append({"token": token, "logprob": float(logprob), "bytes": list(token.encode("utf-8")),
                        "top_logprobs": []})
    return {"content": content}


def _flatten_content(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI content-part lists (``[{"type": "text", "text": ...}]``) as one string, as templates expect."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        return {**message, "content": text}
    return message


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
    tool_calls = [
        {
            "id": call.id or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
        }
        for call in parsed.calls
    ]
    return {"role": "assistant", "content": parsed.content.strip() or None, "tool_calls": tool_calls}


def build_chat_completion(
    *,
    completion_id: str,
    model: str,
    prompt_len: int,
    result: GenerateResult,
    message: dict[str, Any],
    created: int | None = None,
) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object for one sampled answer."""
    if message.get("tool_calls"):
        finish_reason = "tool_calls"
    else:
        finish_reason = "length" if result.finish_reason == "length" else "stop"
    completion_tokens = len(result.token_ids)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_len + completion_tokens,
        },
        "system_fingerprint": f"policy-v{result.policy_version}",
    }


app = FastAPI(title="tandem-rl rollout")


@app.exception_handler(HTTPException)
async def _openai_error(request: Request, exc: HTTPException) -> JSONResponse:
    # OpenAI clients read ``error.message``; FastAPI's default body is ``{"detail": ...}``.
    return JSONResponse(
        status_code=exc.status_code,
        content={"error": {"message": str(exc.detail), "type": "invalid_request_error", "code": exc.status_code}},
        headers=exc.headers,
    )


@app.exception_handler(RequestValidationError)
async def _openai_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI answers a bad body with 422 and {"detail": [...]}; OpenAI with 400 and one message naming the field.
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
        parts.append(f"{where}: {str(err.get('msg', '')).removeprefix('Value error, ')}" if where else err.get("msg"))
    return JSONResponse(status_code=400, content={"error": {
        "message": "; ".join(parts), "type": "invalid_request_error", "code": 400}})


@serve.deployment(name="OpenAIIngress", num_replicas=1, ray_actor_options={"num_cpus": 0.1})
@serve.ingress(app)
class OpenAIIngress:
    """``/v1/chat/completions``, ``/v1/models`` and ``/v1/sessions/{id}`` over a ``RolloutServer`` handle."""

    def __init__(
        self,
        rollout: DeploymentHandle,
        model_path: str,
        served_model_name: str,
        parser: str,
        max_model_len: int,
        api_key_env: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer  # heavy import, only in the replica

        self.rollout = rollout
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.served_model_name = served_model_name
        self.parser = parser
        self.max_model_len = max_model_len
        self.api_key = os.environ.get(api_key_env) if api_key_env else None
        self.sessions: OrderedDict[str, list[SessionCall]] = OrderedDict()

    def _authorize(self, authorization: str | None) -> None:
        if self.api_key and authorization != f"Bearer {self.api_key}":
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    @app.get("/v1/models")
    async def models(self, authorization: str | None = Header(default=None)) -> dict[str, Any]:
        self._authorize(authorization)
        entry = {"id": self.served_model_name, "object": "model", "created": 0, "owned_by": "tandem-rl"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions")
    async def chat_completions(
        self,
        body: ChatCompletionRequest,
        authorization: str | None = Header(default=None),
        x_session_id: str | None = Header(default=None),
    ) -> dict[str, Any]:
        self._authorize(authorization)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        prompt_ids = self._render(body)
        request = GenerateRequest(
            prompt_ids=prompt_ids,
            sampling=self._sampling(body, len(prompt_ids)),
            trajectory_id=x_session_id or "",
            request_id=completion_id,
        )
        try:
            result: GenerateResult = await self.rollout.generate.remote(request)
        except PromptTooLong as exc:  # the engine's check; the message names the request
            raise HTTPException(400, str(getattr(exc, "cause", exc))) from None
        if result.finish_reason == "abort":
            raise HTTPException(503, f"request {completion_id} was aborted by the engine")
        ids, logprobs, before_stop = apply_stop(result.token_ids, result.logprobs, self.tokenizer, body.stop)
        if before_stop is not None:
            result = replace(result, token_ids=ids, logprobs=logprobs, finish_reason="stop",
                             token_versions=result.token_versions[:len(ids)])
        if x_session_id:
            self._record(x_session_id, SessionCall(prompt_ids, result.token_ids, result.logprobs,
                                                   result.policy_version, result.finish_reason))
        parse_tools = bool(body.tools) and body.tool_choice != "none"
        message = completion_message(result.token_ids, self.tokenizer, self.parser, parse_tools)
        if before_stop is not None:  # the stop string and what the last token carried past it are not content
            message = {"role": "assistant", "content": before_stop} if not message.get("tool_calls") else message
        response = build_chat_completion(
            completion_id=completion_id,
            model=body.model or self.served_model_name,
            prompt_len=len(prompt_ids),
            result=result,
            message=message,
        )
        choice = response["choices"][0]
        if body.logprobs:
            choice["logprobs"] = logprobs_content(result.token_ids, result.logprobs, self.tokenizer)
        if body.return_token_ids:
            response["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(result.token_ids)
        return response

    @app.get("/v1/sessions/{session_id}")
    async def get_session(self, session_id: str, authorization: str | None = Header(default=None)) -> dict[str, Any]:
        self._authorize(authorization)
        calls = self.sessions.get(session_id)
        if calls is None:
            raise HTTPException(404, f"no calls recorded for session {session_id!r}")
        return {"session_id": session_id, "calls": [asdict(c) for c in calls]}

    async def pop_session(self, session_id: str) -> list[SessionCall]:
        """Handle method for trainers: the session's calls, removed from memory ([] if none)."""
        return self.sessions.pop(session_id, [])

    def _render(self, body: ChatCompletionRequest) -> tuple[int, ...]:
        messages = [_flatten_content(m) for m in body.messages]
        tools = body.tools if body.tools and body.tool_choice != "none" else None
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # a template error is the caller's malformed conversation
            raise HTTPException(400, f"messages do not render with the chat template: {exc}") from None
        if len(ids) >= self.max_model_len:
            raise HTTPException(
                400, f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} (not truncated)"
            )
        return tuple(ids)

    def _sampling(self, body: ChatCompletionRequest, prompt_len: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        wanted = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        stop = [t for t in (self.tokenizer.eos_token_id,) if t is not None]
        return SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=min(wanted, room),
            stop_token_ids=tuple(stop),
            seed=body.seed,
        )

    def _record(self, session_id: str, call: SessionCall) -> None:
        self.sessions.setdefault(session_id, []).append(call)
        self.sessions.move_to_end(session_id)
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
