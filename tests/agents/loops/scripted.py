"""Test helpers for agent loops: a scripted generator, small tools, and a token-exactness check."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.chat import ChatDelta, render_text
from agents.loops import AgentContext, Episode, EpisodeResult, LoopLimits
from agents.parsers import parse_tool_calls
from agents.records import GenerateRequest, GenerateResult, SamplingParams
from agents.tools.base import Tool, ToolError


@dataclass
class Turn:
    """One scripted model turn: the ids it returns (cut to max_new_tokens -> "length")."""

    token_ids: list[int]
    finish_reason: str = "stop"
    policy_version: int = 0


@dataclass
class ScriptedGenerator:
    """Returns pre-scripted turns in order and records every request and every returned result."""

    turns: list[Turn]
    requests: list[GenerateRequest] = field(default_factory=list)
    results: list[GenerateResult] = field(default_factory=list)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        if not self.turns:
            raise AssertionError(f"request {request.request_id!r}: the script has no turn left")
        turn = self.turns.pop(0)
        ids, reason = turn.token_ids, turn.finish_reason
        if len(ids) > request.sampling.max_new_tokens:
            ids, reason = ids[: request.sampling.max_new_tokens], "length"
        # Log-probs that identify their token, so the test can check they were kept in place.
        result = GenerateResult(tuple(ids), tuple(-t / 1e6 for t in ids), reason, turn.policy_version)
        self.results.append(result)
        return result


def say(tokenizer: Any, text: str, eos: bool = True) -> Turn:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return Turn(ids + ([tokenizer.convert_tokens_to_ids("<|im_end|>")] if eos else []))


def call_text(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


class SleepTool(Tool):
    """Sleeps ``seconds`` then answers ``slept``."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "sleep", "description": "Wait.", "parameters": {
            "type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}}}

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        await asyncio.sleep(float(arguments["seconds"]))
        return "slept"


class BoomTool(Tool):
    """Raises: RuntimeError by default, ToolError when asked for a user-visible error."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "boom", "description": "Fail.", "parameters": {
            "type": "object", "properties": {"kind": {"type": "string"}}}}}

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        if arguments.get("kind") == "tool_error":
            raise ToolError("boom: bad kind")
        raise RuntimeError("kaboom")


class BarrierTool(Tool):
    """Answers only once ``parties`` calls are inside at the same time (proves concurrency)."""

    def __init__(self, parties: int):
        super().__init__()
        self.barrier = asyncio.Barrier(parties)

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "meet", "description": "Meet.", "parameters": {
            "type": "object", "properties": {}}}}

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        await self.barrier.wait()
        return "met"


class EchoTool(Tool):
    """Returns ``text`` as given (for truncation tests)."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "echo", "description": "Echo.", "parameters": {
            "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        return str(arguments["text"])


def make_context(
    tokenizer: Any, turns: list[Turn], tools: Sequence[Tool] = (), fmt: str = "hermes", **limits: Any
) -> tuple[AgentContext, ScriptedGenerator]:
    generator = ScriptedGenerator(list(turns))
    limits.setdefault("max_response_length", 512)
    limits.setdefault("max_model_len", 4096)
    ctx = AgentContext(
        generator=generator,
        chat=ChatDelta(tokenizer),
        parse=lambda text: parse_tool_calls(text, fmt),
        limits=LoopLimits(**limits),
        tools={t.name: t for t in tools},
    )
    return ctx, generator


def make_episode(
    question: str = "What is 6*7?", agent_name: str = "tool_agent", data_source: str = "openai/gsm8k",
    ground_truth: Any = "42", tools_kwargs: dict[str, Any] | None = None, system: str | None = None,
) -> Episode:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return Episode(
        trajectory_id="g0-0", group_id="g0", messages=tuple(messages), agent_name=agent_name,
        data_source=data_source, ground_truth=ground_truth, sampling=SamplingParams(seed=7),
        tools_kwargs=tools_kwargs or {},
    )


def assert_token_exact(result: EpisodeResult, generator: ScriptedGenerator, tokenizer: Any, tools: Any) -> None:
    """Mask-1 tokens are the generator's ids in order (with their log-probs); the rest has mask 0 and
    log-prob 0.0; prompt + response decodes to the template rendering of the conversation."""
    traj = result.trajectory
    sampled = [t for t, m in zip(traj.response_ids, traj.response_mask) if m == 1]
    assert sampled == [t for r in generator.results for t in r.token_ids]
    kept = [lp for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 1]
    assert kept == [lp for r in generator.results for lp in r.logprobs]
    assert all(lp == 0.0 for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 0)
    schemas = [t.schema for t in tools] or None
    messages = list(result.messages)
    text = tokenizer.decode(list(traj.prompt_ids) + list(traj.response_ids))
    if messages[-1]["role"] == "assistant":
        last = generator.results[-1].token_ids
        expected = render_text(tokenizer, messages[:-1], schemas, add_generation_prompt=True) + tokenizer.decode(
            list(last)
        )
    else:
        expected = render_text(tokenizer, messages, schemas, add_generation_prompt=True)
    assert text == expected
