"""The agent-loop state machine and the small protocols it depends on (agents layer: pure asyncio).

One ``AgentLoop`` runs one episode (one sample of one row) as an explicit state machine::

    PENDING -> GENERATING <-> PROCESSING_TOOLS -> TERMINATED

Each state is one short method returning the next state; the reason the episode ended is a
``Termination`` on the trajectory. The loop sees only a ``Generator`` (token in, token out), tools, a
parser function, a ``ChatDelta`` (tokenizer + chat template), a reward function and a ``Tracer``;
no Ray, so unit tests drive it with a scripted generator.

Budget rules (all in tokens):
- every generate asks for ``max_new_tokens = min(response budget left, context left)`` where the
  response budget is ``data.max_response_length`` shared by all turns (tool tokens count against it)
  and the context is ``max_model_len`` minus prompt and response so far;
- a tool delta that does not fit in what is left ends the episode *without* appending it
  (``RESPONSE_BUDGET`` or ``MAX_MODEL_LEN``), as verl does: a cut tool turn would be a chat turn
  the template can never render, and there would be no room left for the model to act on it.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from agents.chat import ChatDelta, Message
from agents.loops.episode import Episode, LoopLimits, RewardFn, row_reward
from agents.loops.tracing import EpisodeSpans, NullTracer, Tracer
from agents.records import GenerateRequest, GenerateResult, ParsedToolCalls, Termination, Trajectory
from agents.data.truncation import apply_prompt_limit
from agents.rewards import RewardScore
from agents.tools.base import Tool


class Generator(Protocol):
    """Token-in/token-out generation (the rollout app behind a handle, or an engine in-process)."""

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...


ParseFn = Callable[[str], ParsedToolCalls]


log = logging.getLogger("tandem_rl.agents")
_truncation_logged: set[str] = set()


def _log_truncation_once(truncation: str, row: object, before: int, after: int) -> None:
    """``data.truncation`` cut an over-long prompt: said once per process and mode, naming the first row."""
    if truncation not in _truncation_logged:
        _truncation_logged.add(truncation)
        log.warning("data.truncation=%s: row %s's prompt has %d tokens, cut to %d (max_prompt_length); later rows "
                    "are cut silently", truncation, row, before, after)


@dataclass
class AgentContext:
    """Everything episodes of one worker share (built once per worker)."""

    generator: Generator
    chat: ChatDelta
    parse: ParseFn
    limits: LoopLimits
    tools: Mapping[str, Tool] = field(default_factory=dict)
    reward: RewardFn = row_reward
    tracer: Tracer = field(default_factory=NullTracer)
    run_id: str = ""
    openai_base_url: str = ""
    """The rollout app's OpenAI endpoint (``http://host:port``), for loops that speak OpenAI (langgraph_sql)."""
    openai_api_key: str = field(default="", repr=False)
    """The endpoint's bearer token when the app requires one (``serve.api_key_env``); empty: it is open."""
    tool_slots: asyncio.Semaphore | None = None
    """Tool calls in flight across the worker's episodes (``tools.max_concurrency``); None = no bound."""
    agent_lightning: Any = None
    """The worker's ``AglClient`` (``agents.loops.agent_lightning``) when ``agent_lightning.server_url`` is set."""


@dataclass(frozen=True)
class EpisodeResult:
    """The trajectory plus the conversation it encodes (prompt messages, assistant and tool turns).

    ``extra`` holds further samples of the same episode when its calls could not be merged into one
    token-exact sequence (agents that speak OpenAI, see ``session_merge``); it is empty for our loops.
    """

    trajectory: Trajectory
    messages: tuple[Message, ...]
    extra: tuple[Trajectory, ...] = ()

    @property
    def trajectories(self) -> list[Trajectory]:
        return [self.trajectory, *self.extra]


class State(str, enum.Enum):
    """The loop's states: each has one handler that returns the next state; ``TERMINATED`` ends ``run``."""

    PENDING = "pending"
    GENERATING = "generating"
    PROCESSING_TOOLS = "processing_tools"
    TERMINATED = "terminated"


@dataclass
class Progress:
    """Mutable state of a running episode."""

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # per response token; -1 on tool/user tokens
    messages: list[Message] = field(default_factory=list)
    last_output: tuple[int, ...] = ()
    last_parsed: ParsedToolCalls | None = None
    last_text: str = ""
    assistant_turns: int = 0
    user_turns: int = 0
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    num_parse_errors: int = 0
    policy_version: int | None = None
    termination: Termination | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.metrics[key] = self.metrics.get(key, 0.0) + value


class AgentLoop:
    """Base loop: pending (prompt), generating (one turn), terminated. Subclasses add tool turns."""

    agent_name = "base"
    use_tools = False

    def __init__(self, ctx: AgentContext, episode: Episode):
        self.ctx = ctx
        self.episode = episode
        self.p = Progress(messages=[dict(m) for m in episode.messages])
        self.spans = EpisodeSpans(ctx.tracer, None)

    def handlers(self) -> dict[State, Callable[[], Awaitable[State]]]:
        return {State.PENDING: self.pending, State.GENERATING: self.generating}

    async def run(self) -> EpisodeResult:
        self.spans = EpisodeSpans(self.ctx.tracer, self._start_trace())
        state = State.PENDING
        handlers = self.handlers()
        try:
            while state is not State.TERMINATED:
                state = await handlers[state]()
            reward = RewardScore.of(await self.compute_reward(), f"trajectory {self.episode.trajectory_id!r}")
        except BaseException as exc:
            self.spans.finish(error=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            await self.release_tools()
        result = self.result(reward)
        self.spans.finish({"termination": result.trajectory.termination.value, "reward": reward.score,
                           **{f"reward/{k}": v for k, v in reward.extra.items()},
                           "num_turns": result.trajectory.num_turns})
        return result

    def _start_trace(self) -> Any | None:
        ep = self.episode
        tags = {"step": str(ep.step), "sample_index": str(ep.sample_index), "agent_name": self.agent_name,
                "run_id": self.ctx.run_id, "trajectory_id": ep.trajectory_id, "group_id": ep.group_id}
        return self.ctx.tracer.start_episode("agent_loop", {"messages": list(ep.messages)}, tags)

    # -- states -------------------------------------------------------------------------------

    async def pending(self) -> State:
        await self.create_tools()
        schemas = [t.schema for t in self.ctx.tools.values()] if self.use_tools else None
        ids = self.ctx.chat.prompt_ids(self.p.messages, schemas)
        limits = self.ctx.limits
        if limits.max_prompt_length is not None and len(ids) > limits.max_prompt_length:
            row = self.episode.extra_info.get("index", self.episode.trajectory_id)
            cut = apply_prompt_limit(ids, limits.max_prompt_length, limits.truncation, row)  # "error" raises
            _log_truncation_once(limits.truncation, row, len(ids), len(cut))
            ids = cut
        self.p.prompt_ids = ids
        return State.GENERATING

    async def generating(self) -> State:
        max_new = self.room()
        if max_new <= 0:
            return self.terminate(self.out_of_room())
        request = GenerateRequest(
            prompt_ids=(*self.p.prompt_ids, *self.p.response_ids),
            sampling=replace(self.episode.sampling, max_new_tokens=max_new),
            trajectory_id=self.episode.trajectory_id,
            request_id=f"{self.episode.trajectory_id}/turn{self.p.assistant_turns}",
        )
        result = await self._traced_generate(request)
        self.append_generated(result)
        if result.finish_reason == "abort":
            return self.terminate(Termination.ENGINE_ABORT)
        if result.finish_reason == "length":
            return self.terminate(self.out_of_room())
        return await self.after_generation()

    async def after_generation(self) -> State:
        """Single turn: the episode ends when the model stops."""
        return self.terminate(Termination.EOS)

    # -- helpers ------------------------------------------------------------------------------

    def budget_left(self) -> int:
        return self.ctx.limits.max_response_length - len(self.p.response_ids)

    def context_left(self) -> int:
        return self.ctx.limits.max_model_len - len(self.p.prompt_ids) - len(self.p.response_ids)

    def room(self) -> int:
        return min(self.budget_left(), self.context_left())

    def out_of_room(self) -> Termination:
        if self.budget_left() <= self.context_left():
            return Termination.RESPONSE_BUDGET
        return Termination.MAX_MODEL_LEN

    def terminate(self, reason: Termination) -> State:
        self.p.termination = reason
        return State.TERMINATED

    async def _traced_generate(self, request: GenerateRequest) -> GenerateResult:
        inputs: dict[str, Any] = {"num_prompt_tokens": len(request.prompt_ids),
                                  "max_new_tokens": request.sampling.max_new_tokens, "seed": request.sampling.seed}
        if self.spans.token2text:
            inputs["prompt_text"] = self.ctx.chat.tokenizer.decode(list(request.prompt_ids))
        span = self.spans.start("generate", "LLM", inputs)
        started = time.perf_counter()
        try:
            result = await self.ctx.generator.generate(request)
        except BaseException as exc:
            self.spans.end(span, error=f"{type(exc).__name__}: {exc}")
            raise
        self.p.add("generate_s", time.perf_counter() - started)
        outputs: dict[str, Any] = {"token_ids": list(result.token_ids), "finish_reason": result.finish_reason,
                                   "policy_version": result.policy_version, "replica_id": result.replica_id}
        if self.spans.token2text:
            outputs["text"] = self.ctx.chat.tokenizer.decode(list(result.token_ids))
        self.spans.end(span, outputs)
        return result

    def append_generated(self, result: GenerateResult) -> None:
        """Model tokens go in exactly as returned: mask 1, the engine's log-probs."""
        p = self.p
        p.response_ids.extend(result.token_ids)
        p.response_mask.extend([1] * len(result.token_ids))
        p.logprobs.extend(result.logprobs)
        p.token_versions.extend(result.token_versions or [result.policy_version] * len(result.token_ids))
        p.last_output = result.token_ids
        p.assistant_turns += 1
        p.add("num_generate_calls", 1)
        p.policy_version = (
            result.policy_version if p.policy_version is None else min(p.policy_version, result.policy_version)
        )
        p.last_text = self.ctx.chat.assistant_text(result.token_ids)
        p.messages.append({"role": "assistant", "content": p.last_text})

    def append_delta(self, ids: Sequence[int]) -> None:
        """Tool/user tokens: mask 0 and log-prob 0.0 (never trained on)."""
        self.p.response_ids.extend(ids)
        self.p.response_mask.extend([0] * len(ids))
        self.p.logprobs.extend([0.0] * len(ids))
        self.p.token_versions.extend([-1] * len(ids))

    # -- tools and reward -----------------------------------------------------------------------

    def _episode_tools(self) -> Mapping[str, Tool]:
        return self.ctx.tools if self.use_tools else {}

    async def create_tools(self) -> None:
        for name, tool in self._episode_tools().items():
            kwargs = dict(self.episode.tools_kwargs.get(name, {}).get("create_kwargs", {}) or {})
            await tool.create(self.episode.trajectory_id, **kwargs)

    async def release_tools(self) -> None:
        for tool in self._episode_tools().values():
            await tool.release(self.episode.trajectory_id)

    def _scoring_tools(self) -> list[Tool]:
        # A tool that overrides calc_reward (the GSM8K answer checker) and that the row configures
        # scores the episode; otherwise the row's rule reward does.
        return [
            tool for name, tool in self._episode_tools().items()
            if name in self.episode.tools_kwargs and getattr(
                tool, "scores_episodes", type(tool).calc_reward is not Tool.calc_reward)
        ]

    async def compute_reward(self) -> float | Mapping[str, Any]:
        """A number or verl's dict (``{"score": …, "acc": …}``)."""
        scoring = self._scoring_tools()
        if scoring:
            scores = [await t.calc_reward(self.episode.trajectory_id) for t in scoring]
            return float(max(scores))
        # Scorers may also declare how the episode used its tools (keyword-only num_tool_calls /
        # num_tool_errors); compute_reward passes each scorer only the keys it declares.
        usage = {"num_tool_calls": self.p.num_tool_calls, "num_tool_errors": self.p.num_tool_errors}
        episode = replace(self.episode, extra_info={**self.episode.extra_info, **usage})
        value = self.ctx.reward(episode, self.p.last_text)
        return await value if inspect.isawaitable(value) else value  # a user's reward function may be async

    def result(self, reward: RewardScore) -> EpisodeResult:
        p = self.p
        if p.termination is None:
            raise RuntimeError(f"trajectory {self.episode.trajectory_id!r}: loop ended without a termination")
        metrics = dict(p.metrics)
        metrics.update(num_user_turns=float(p.user_turns), response_length=float(len(p.response_ids)),
                       prompt_length=float(len(p.prompt_ids)), num_policy_tokens=float(sum(p.response_mask)))
        trajectory = Trajectory(
            trajectory_id=self.episode.trajectory_id,
            group_id=self.episode.group_id,
            prompt_ids=tuple(p.prompt_ids),
            response_ids=tuple(p.response_ids),
            response_mask=tuple(p.response_mask),
            rollout_logprobs=tuple(p.logprobs),
            reward=reward.score,
            reward_extra=reward.extra,
            policy_version=p.policy_version or 0,
            token_versions=tuple(p.token_versions),
            agent_name=self.agent_name,
            termination=p.termination,
            num_turns=p.assistant_turns,
            num_tool_calls=p.num_tool_calls,
            num_tool_errors=p.num_tool_errors,
            num_parse_errors=p.num_parse_errors,
            metrics=metrics,
        )
        return EpisodeResult(trajectory, tuple(p.messages))
