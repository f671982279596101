"""OpenAI-compatible HTTP ingress of the rollout app (deployments layer).

``POST /v1/chat/completions`` renders the messages (and tool schemas) with the tokenizer's chat template,
``POST /v1/completions`` takes a text or token-id prompt; both call ``RolloutServer.generate`` token-in/token-out
through its handle (the session id is the trajectory id, so one agent session stays on one replica), decode the
sampled ids and, for chat, parse tool calls with the configured parser into OpenAI ``tool_calls``. ``n`` samples
go out as ``n`` generate calls; ``stream: true`` answers with server-sent events once the samples are done. Request
models and every response body are built in ``openai_protocol`` and ``openai_stream`` (pure functions).

Each call's exact tokens, log-probs and policy version are kept under the request's ``x-session-id`` header, so
a trainer can collect token-exact trajectories from any agent framework that speaks OpenAI (the Agent Lightning
pattern): ``GET /v1/sessions/{id}`` reads them, the handle method ``pop_session(id)`` reads and drops them. The
records live in one ``SessionStore`` actor per app, which every ingress replica writes to and reads from, so the
ingress can run several replicas.
"""

# No ``from __future__ import annotations`` here: FastAPI must see the real request-model classes on the
# route signatures (Serve's ingress wrapper cannot resolve string annotations, and the body became a query).
import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import asdict, replace
from typing import Any

import ray
from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from agents.loops.session_merge import SessionCall, agl_session_id
from agents.records import GenerateRequest, GenerateResult, SamplingParams
from deployments.access import BearerToken
from deployments.engines.base import PromptTooLong
from deployments.openai_protocol import (
    ERROR_RESPONSES,
    GENERATE_RESPONSES,
    HEALTH_RESPONSES,
    SESSION_RESPONSES,
    ChatCompletionRequest,
    CompletionRequest,
    Sample,
    SamplingRequest,
    apply_stop,
    build_chat_completion,
    flatten_content,
    forced_tool_message,
    forced_tool_schema,
    logprobs_content,
    sample_message,
    text_completion,
)
from deployments.openai_stream import chat_chunks, sse, text_chunks, usage_chunk
from deployments.replica_retry import ReplicaLost, call_surviving_deaths
from deployments.session_replay import replay_prompt_ids

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 512
MAX_SESSIONS = 10_000  # oldest sessions are dropped first when a trainer never collects them
SESSION_HEADER = "x-session-id"


@ray.remote(num_cpus=0)
class SessionStore:
    """The recorded calls of every session of one app, shared by its ingress replicas (an ``OrderedDict``: the
    least recently written session is dropped first beyond ``max_sessions``)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self.sessions: OrderedDict[str, list[SessionCall]] = OrderedDict()

    def record(self, session_id: str, calls: list[SessionCall]) -> None:
        self.sessions.setdefault(session_id, []).extend(calls)
        self.sessions.move_to_end(session_id)
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)

    def get(self, session_id: str) -> list[SessionCall] | None:
        return self.sessions.get(session_id)

    def pop(self, session_id: str) -> list[SessionCall]:
        return self.sessions.pop(session_id, [])


app = FastAPI(title="tandem-rl rollout")
# the schema and the readiness probe: no model, no record (a Kubernetes probe carries no token; vLLM's /health is open)
OPEN_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/health"})


def _replica_token() -> BearerToken | None:
    """The token of the ingress replica serving this request (read from the replica's own object: a module global
    would not survive Serve shipping the app to its replicas)."""
    return serve.get_replica_context().servable_object.api_key


UNAUTHORIZED = {"message": "missing or wrong bearer token: send the token of serve.api_key_env as "
                           "'Authorization: Bearer <token>'", "type": "invalid_request_error", "param": None,
                "code": "invalid_api_key"}


@app.middleware("http")
async def _authorized(request: Request, call_next: Any) -> Any:
    """Every request but the schema's passes here first, before routing and before its body is read or validated: a
    request without the token gets a 401, never a 400 that describes the schema."""
    root = request.scope.get("root_path", "")
    path = request.url.path[len(root):] if root and request.url.path.startswith(root) else request.url.path
    token = _replica_token()
    if token is not None and path not in OPEN_PATHS and not token.admits(request.headers.get("authorization")):
        return JSONResponse(status_code=401, content={"error": UNAUTHORIZED}, headers={"WWW-Authenticate": "Bearer"})
    return await call_next(request)


@app.exception_handler(HTTPException)
async def _openai_error(request: Request, exc: HTTPException) -> JSONResponse:
    # OpenAI clients read ``error.message``; FastAPI's default body is ``{"detail": ...}``. A 401 carries OpenAI's
    # own code for it, which its SDK raises as AuthenticationError.
    code = "invalid_api_key" if exc.status_code == 401 else exc.status_code
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return JSONResponse(
        status_code=exc.status_code,
        content={"error": {"message": str(exc.detail), "type": kind, "param": None, "code": code}},
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
    """``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/v1/sessions/{id}`` and ``/health`` over a
    ``RolloutServer`` handle."""

    health_cache_s = 1.0  # /health asks Serve's controller at most this often per ingress replica

    def __init__(
        self,
        rollout: DeploymentHandle,
        model_path: str,
        served_model_name: str,
        parser: str,
        max_model_len: int,
        api_key: BearerToken | None = None,
        engine: str = "hf",
    ) -> None:
        from transformers import AutoTokenizer  # heavy import, only in the replica

        self.rollout = rollout
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.served_model_name = served_model_name
        self.parser = parser
        self.max_model_len = max_model_len
        self.engine = engine  # the rollout engine's name: only vllm decodes under a JSON schema
        self.api_key = api_key  # BearerToken: compares in constant time, never prints its value (_authorized)
        self._store_name = f"tandem-sessions-{serve.get_replica_context().app_name}"
        self._store = self._session_store()
        self._health: tuple[float, int] = (float("-inf"), 0)  # (when asked, rollout replicas running)

    def _session_store(self) -> Any:
        # One per app, found by name; owned by the replica that created it first (a later replica or a restarted
        # one finds it, or makes a new one if its owner died: the records it held are then lost, as on a restart).
        return SessionStore.options(name=self._store_name, get_if_exists=True).remote()

    async def _call_store(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._store, method).remote(*args)
        except ray.exceptions.RayActorError:
            logger.warning("session store %s was lost (its owning ingress replica stopped); starting a new one",
                           self._store_name)
            self._store = self._session_store()
            return await getattr(self._store, method).remote(*args)

    @app.get("/health", responses=HEALTH_RESPONSES)
    async def health(self) -> dict[str, Any]:
        """Readiness: 200 once a rollout replica of this app is running, 503 before. The ingress answers HTTP as soon
        as it is up, while a rollout replica may still be building its engine (vLLM's CPU engine: about a minute);
        a request sent then waits for it. Load balancers, Kubernetes probes and scripts wait on this route."""
        running = await self._running_rollout_replicas()
        if not running:
            raise HTTPException(503, f"no replica of {self.rollout.deployment_name} is running yet (its engine may "
                                     "still be building); ask again", headers={"Retry-After": "2"})
        return {"status": "ok", "rollout_replicas": running}

    async def _running_rollout_replicas(self) -> int:
        asked, running = self._health
        if time.monotonic() - asked < self.health_cache_s:
            return running
        app_name, deployment = self.rollout.app_name, self.rollout.deployment_name
        try:
            status = await asyncio.to_thread(serve.status)  # a controller call: off the event loop
        except Exception:  # a controller that does not answer (restarting): not ready, never a 500
            logger.warning("/health: Serve's controller did not answer", exc_info=True)
            return 0
        app_status = status.applications.get(app_name)
        deployment_status = app_status.deployments.get(deployment) if app_status is not None else None
        running = deployment_status.replica_states.get("RUNNING", 0) if deployment_status is not None else 0
        self._health = (time.monotonic(), running)
        return running

    @app.get("/v1/models", responses=ERROR_RESPONSES)
    async def models(self) -> dict[str, Any]:
        entry = {"id": self.served_model_name, "object": "model", "created": 0, "owned_by": "tandem-rl"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions", responses=GENERATE_RESPONSES)
    async def chat_completions(
        self,
        body: ChatCompletionRequest,
        x_session_id: str | None = Header(default=None),
    ) -> Any:
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        forced = body.forced_tool
        schema = None
        if forced is not None:
            if self.engine != "vllm":
                raise HTTPException(400, f"tool_choice {body.tool_choice!r} forces a tool call, which needs constrained "
                                         f"decoding: this app's engine is {self.engine!r}; serve with the vllm engine "
                                         "(actor_rollout_ref.rollout.name=vllm), or send tool_choice 'auto'")
            schema = json.dumps(forced_tool_schema(forced, body.tools or []))
        prompt_ids = await self._render(body, x_session_id)
        wanted = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        samples = await self._sample(body, prompt_ids, wanted, completion_id, x_session_id, json_schema=schema)
        model = body.model or self.served_model_name
        messages = [forced_tool_message(s, self.tokenizer, forced) if forced is not None
                    else sample_message(s, self.tokenizer, self.parser, body.parse_tools) for s in samples]
        if body.stream:
            created = int(time.time())
            chunks = []
            for index, (sample, message) in enumerate(zip(samples, messages)):
                chunks += chat_chunks(completion_id=completion_id, created=created, model=model, index=index,
                                      sample=sample, message=message, tokenizer=self.tokenizer, parser=self.parser,
                                      parse_tools=body.parse_tools, logprobs=body.logprobs,
                                      token_ids=body.return_token_ids, forced=forced is not None)
            return self._stream(chunks, body, completion_id, created, model, "chat.completion.chunk", prompt_ids,
                                samples)
        response = build_chat_completion(completion_id=completion_id, model=model, prompt_len=len(prompt_ids),
                                         answers=[(s.result, m) for s, m in zip(samples, messages)])
        for choice, sample in zip(response["choices"], samples):
            if body.logprobs:
                choice["logprobs"] = logprobs_content(sample.result.token_ids, sample.result.logprobs, self.tokenizer)
            if body.return_token_ids:
                choice["token_ids"] = list(sample.result.token_ids)
        if body.return_token_ids:
            response["prompt_token_ids"] = list(prompt_ids)
        return response

    @app.post("/v1/completions", responses=GENERATE_RESPONSES)
    async def completions(
        self,
        body: CompletionRequest,
        x_session_id: str | None = Header(default=None),
    ) -> Any:
        completion_id = f"cmpl-{uuid.uuid4().hex}"
        prompt_ids = self._prompt_ids(body)
        samples = await self._sample(body, prompt_ids, body.max_tokens or 16, completion_id, x_session_id)
        model = body.model or self.served_model_name
        logprobs = body.logprobs is not None
        if body.stream:
            created = int(time.time())
            chunks = []
            for index, sample in enumerate(samples):
                chunks += text_chunks(completion_id=completion_id, created=created, model=model, index=index,
                                      sample=sample, tokenizer=self.tokenizer, logprobs=logprobs,
                                      token_ids=body.return_token_ids)
            return self._stream(chunks, body, completion_id, created, model, "text_completion", prompt_ids, samples)
        response = text_completion(completion_id=completion_id, model=model, prompt_len=len(prompt_ids),
                                   samples=samples, tokenizer=self.tokenizer, logprobs=logprobs)
        if body.return_token_ids:
            response["prompt_token_ids"] = list(prompt_ids)
            for choice, sample in zip(response["choices"], samples):
                choice["token_ids"] = list(sample.result.token_ids)
        return response

    # Agent Lightning 0.3.x's ``ProxyLLM`` puts ``/rollout/{rollout_id}/attempt/{attempt_id}`` before ``/v1`` in each
    # rollout's base URL: the same endpoints, recorded under that rollout's session (``agl_session_id``).
    @app.get("/rollout/{rollout_id}/attempt/{attempt_id}/v1/models", responses=ERROR_RESPONSES)
    async def rollout_models(self, rollout_id: str, attempt_id: str) -> dict[str, Any]:
        return await self.models()

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/chat/completions", responses=GENERATE_RESPONSES)
    async def rollout_chat_completions(self, rollout_id: str, attempt_id: str, body: ChatCompletionRequest) -> Any:
        return await self.chat_completions(body, x_session_id=agl_session_id(rollout_id, attempt_id))

    @app.post("/rollout/{rollout_id}/attempt/{attempt_id}/v1/completions", responses=GENERATE_RESPONSES)
    async def rollout_completions(self, rollout_id: str, attempt_id: str, body: CompletionRequest) -> Any:
        return await self.completions(body, x_session_id=agl_session_id(rollout_id, attempt_id))

    @app.get("/v1/sessions/{session_id}", responses=SESSION_RESPONSES)
    async def get_session(self, session_id: str) -> dict[str, Any]:
        calls = await self._call_store("get", session_id)
        if calls is None:
            raise HTTPException(404, f"no calls recorded for session {session_id!r}")
        return {"session_id": session_id, "calls": [asdict(c) for c in calls]}

    async def pop_session(self, session_id: str) -> list[SessionCall]:
        """Handle method for trainers: the session's calls, removed from the store ([] if none)."""
        return await self._call_store("pop", session_id)

    # ------------------------------------------------------------------ helpers

    def _stream(self, chunks: list[dict[str, Any]], body: SamplingRequest, completion_id: str, created: int,
                model: str, obj: str, prompt_ids: tuple[int, ...], samples: list[Sample]) -> StreamingResponse:
        if body.include_usage:
            chunks.append(usage_chunk(completion_id, created, model, obj, len(prompt_ids), samples))
        return StreamingResponse(iter([sse(chunks)]), media_type="text/event-stream")

    async def _sample(self, body: SamplingRequest, prompt_ids: tuple[int, ...], wanted: int, completion_id: str,
                      session_id: str | None, json_schema: str | None = None) -> list[Sample]:
        """``body.n`` answers to one prompt (generated together), ``stop`` applied, recorded under the session."""
        sampling = replace(self._sampling(body, len(prompt_ids), wanted), json_schema=json_schema)
        requests = [
            GenerateRequest(
                prompt_ids=prompt_ids,
                sampling=sampling if body.seed is None else replace(sampling, seed=body.seed + i),
                trajectory_id=session_id or "",
                request_id=completion_id if body.n == 1 else f"{completion_id}-{i}",
            )
            for i in range(body.n)
        ]
        results = await self._generate(requests)
        samples = []
        for result in results:
            ids, logprobs, before_stop = apply_stop(result.token_ids, result.logprobs, self.tokenizer, body.stop)
            if before_stop is not None:
                result = replace(result, token_ids=ids, logprobs=logprobs, finish_reason="stop",
                                 token_versions=result.token_versions[:len(ids)])
            samples.append(Sample(result, before_stop))
        if session_id:
            await self._call_store("record", session_id, [
                SessionCall(prompt_ids, s.result.token_ids, s.result.logprobs, s.result.policy_version,
                            s.result.finish_reason) for s in samples])
        return samples

    async def _generate(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        # a replica that dies under the call: the same tokens and seeds go to another replica (call_surviving_deaths);
        # when every try dies, a 503 that names the request, in OpenAI's error shape, instead of a 500 or a hang
        what = f"request {requests[0].request_id}"  # a group of n: its first answer's id names it
        try:
            if len(requests) == 1:
                results = [await call_surviving_deaths(lambda: self.rollout.generate.remote(requests[0]), what)]
            else:  # one call (see RolloutServer.generate_group)
                results = await call_surviving_deaths(lambda: self.rollout.generate_group.remote(requests), what)
        except PromptTooLong as exc:  # the engine's check; the message names the request
            raise HTTPException(400, str(getattr(exc, "cause", exc))) from None
        except ReplicaLost as exc:
            logger.warning("%s", exc)
            raise HTTPException(503, f"{exc}; retry it", headers={"Retry-After": "1"}) from None
        for request, result in zip(requests, results):
            if result.finish_reason == "abort":
                raise HTTPException(503, f"request {request.request_id} was aborted by the engine")
        return results

    async def _render(self, body: ChatCompletionRequest, session_id: str | None) -> tuple[int, ...]:
        messages = [flatten_content(m) for m in body.messages]
        tools = body.tools if body.parse_tools else None
        calls = await self._call_store("get", session_id) if session_id else None
        if calls and any(m.get("role") == "assistant" for m in messages):
            # the model's earlier answers as the ids it sampled, not as the template re-renders their text
            try:
                ids, _ = replay_prompt_ids(self.tokenizer, messages, tools, calls, self.parser)
            except Exception:  # a template that cannot take the placeholder: render as usual
                logger.debug("session %s: replaying recorded answers failed", session_id, exc_info=True)
                ids = None
            if ids is not None:
                return self._check_length(ids)
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as exc:  # a template error is the caller's malformed conversation
            raise HTTPException(400, f"messages do not render with the chat template: {exc}") from None
        return self._check_length(tuple(ids))

    def _prompt_ids(self, body: CompletionRequest) -> tuple[int, ...]:
        if isinstance(body.prompt, str):
            return self._check_length(tuple(self.tokenizer.encode(body.prompt, add_special_tokens=False)))
        vocab = len(self.tokenizer)
        bad = next((t for t in body.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise HTTPException(400, f"prompt: token id {bad} outside the vocabulary [0, {vocab})")
        return self._check_length(tuple(body.prompt))

    def _check_length(self, ids: tuple[int, ...]) -> tuple[int, ...]:
        if len(ids) >= self.max_model_len:
            raise HTTPException(
                400, f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} (not truncated)"
            )
        return ids

    def _sampling(self, body: SamplingRequest, prompt_len: int, wanted: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        stop = [t for t in (self.tokenizer.eos_token_id,) if t is not None]
        return SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=min(wanted, room),
            stop_token_ids=tuple(stop),
            seed=body.seed,
        )
