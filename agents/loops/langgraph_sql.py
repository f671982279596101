"""``langgraph_sql``: a LangGraph ReAct agent over the SQL tools, trained through the OpenAI ingress
(agents layer: asyncio + langchain/langgraph/httpx; no ray).

The agent is an ordinary LangGraph program: ``create_react_agent`` with a ``ChatOpenAI`` model pointed at
the rollout app's OpenAI endpoint and the episode's SQL tools wrapped as LangChain tools. It never sees
token ids. The ingress records every call of the session named by the ``x-session-id`` header (the
trajectory id); afterwards ``GET /v1/sessions/{id}`` returns them and ``merge_session_calls`` turns them
into token-exact samples (one per run of calls whose prompts extend each other).

Limits: ``max_assistant_turns`` becomes LangGraph's recursion limit (two graph steps per turn); each call
asks for at most ``data.max_response_length`` new tokens (the shared budget cannot be enforced inside a
framework that owns the conversation); a prompt the ingress rejects as too long ends the episode.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import openai
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from agents.loops.base import AgentContext, EpisodeResult
from agents.loops.episode import Episode
from agents.loops.session_merge import MergedSample, SessionCall, merge_session_calls
from agents.loops.tool_calls import run_tool_calls
from agents.loops.tracing import EpisodeSpans
from agents.records import Termination, ToolCall, Trajectory
from agents.rewards import RewardScore
from agents.tools.base import Tool

SQL_TOOL_NAMES = ("search_schema", "get_columns", "execute_sql")
API_KEY = "tandem-local"  # the ingress is open unless the app sets api_key_env; then pass the token


def _langchain_tool(ctx: AgentContext, tool: Tool, instance_id: str) -> StructuredTool:
    """A LangChain tool running ``tool`` through the same fault boundary as ``tool_agent``."""

    async def call(**arguments: Any) -> str:
        (result,) = await run_tool_calls(
            {tool.name: tool}, instance_id, [ToolCall(tool.name, dict(arguments))], max_parallel_calls=1,
            timeout_s=ctx.limits.tool_timeout_s, spans=EpisodeSpans(ctx.tracer, None), slots=ctx.tool_slots,
        )
        return result.content

    fn = tool.schema["function"]
    return StructuredTool.from_function(
        coroutine=call, name=tool.name, description=fn.get("description", tool.name),
        args_schema=fn.get("parameters", {"type": "object", "properties": {}}),
    )


def _chat_model(ctx: AgentContext, episode: Episode, api_key: str) -> ChatOpenAI:
    if not ctx.openai_base_url:
        raise ValueError(f"trajectory {episode.trajectory_id!r}: langgraph_sql needs AgentContext.openai_base_url")
    sampling = episode.sampling
    return ChatOpenAI(
        model="tandem",
        base_url=f"{ctx.openai_base_url.rstrip('/')}/v1",
        api_key=api_key,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        max_completion_tokens=ctx.limits.max_response_length,
        default_headers={"x-session-id": episode.trajectory_id},
        max_retries=0,  # a retried call would be recorded twice in the session
    )


async def fetch_session(base_url: str, session_id: str, api_key: str = API_KEY) -> list[SessionCall]:
    """The recorded calls of ``session_id`` ([] when the ingress has none)."""
    url = f"{base_url.rstrip('/')}/v1/sessions/{session_id}"
    async with httpx.AsyncClient(timeout=30.0) as client:
        response = await client.get(url, headers={"Authorization": f"Bearer {api_key}"})
    if response.status_code == 404:
        return []
    response.raise_for_status()
    calls = response.json()["calls"]
    return [SessionCall.from_json(c, f"session {session_id!r} call {i}") for i, c in enumerate(calls)]


def _as_dict(message: BaseMessage) -> dict[str, Any]:
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            out["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
                                 for c in message.tool_calls]
        return out
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": str(message.content)}
    role = {"human": "user", "system": "system"}.get(message.type, message.type)
    return {"role": role, "content": str(message.content)}


def _trajectory(episode: Episode, sample: MergedSample, index: int, reward: RewardScore, termination: Termination,
                messages: Sequence[BaseMessage]) -> Trajectory:
    tool_messages = [m for m in messages if isinstance(m, ToolMessage)]
    return Trajectory(
        trajectory_id=episode.trajectory_id if index == 0 else f"{episode.trajectory_id}/part{index}",
        group_id=episode.group_id,
        prompt_ids=sample.prompt_ids,
        response_ids=tuple(sample.response_ids),
        response_mask=tuple(sample.response_mask),
        rollout_logprobs=tuple(sample.logprobs),
        reward=reward.score,
        reward_extra=reward.extra,
        policy_version=sample.policy_version,
        agent_name="langgraph_sql",
        termination=termination,
        num_turns=sample.num_calls,
        num_tool_calls=len(tool_messages) if index == 0 else 0,
        num_tool_errors=sum(str(m.content).startswith("Error: ") for m in tool_messages) if index == 0 else 0,
        metrics={"num_llm_calls": float(sample.num_calls)},
    )


async def _run_graph(ctx: AgentContext, episode: Episode, tools: Mapping[str, Tool], api_key: str
                     ) -> tuple[list[BaseMessage], Termination]:
    graph = create_react_agent(
        _chat_model(ctx, episode, api_key),
        [_langchain_tool(ctx, t, episode.trajectory_id) for t in tools.values()],
    )
    turns = ctx.limits.max_assistant_turns or 8
    state_in = {"messages": [dict(m) for m in episode.messages]}
    try:
        state = await graph.ainvoke(state_in, config={"recursion_limit": 2 * turns + 1})
    except GraphRecursionError:
        return [], Termination.MAX_ASSISTANT_TURNS
    except openai.BadRequestError:  # the ingress refuses prompts over max_model_len
        return [], Termination.MAX_MODEL_LEN
    return list(state["messages"]), Termination.ANSWERED


async def run_langgraph_sql(ctx: AgentContext, episode: Episode, api_key: str = API_KEY) -> EpisodeResult:
    """Run the graph, then build trajectories from the session the ingress recorded."""
    tools = {name: ctx.tools[name] for name in SQL_TOOL_NAMES if name in ctx.tools}
    for name, tool in tools.items():
        await tool.create(episode.trajectory_id, **dict(episode.tools_kwargs.get(name, {}).get("create_kwargs", {})))
    try:
        messages, termination = await _run_graph(ctx, episode, tools, api_key)
    finally:
        await asyncio.gather(*(t.release(episode.trajectory_id) for t in tools.values()))
    samples = merge_session_calls(await fetch_session(ctx.openai_base_url, episode.trajectory_id, api_key))
    if not samples:
        raise RuntimeError(f"trajectory {episode.trajectory_id!r}: the ingress recorded no LLM call")
    if termination is Termination.ANSWERED and samples[-1].last_finish_reason == "length":
        termination = Termination.RESPONSE_BUDGET
    final = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    answer = str(final.content) if final is not None else ""
    value = ctx.reward(episode, answer)
    value = await value if inspect.isawaitable(value) else value  # a user's reward function may be async
    reward = RewardScore.of(value, f"trajectory {episode.trajectory_id!r}")
    trajectories = [_trajectory(episode, s, i, reward, termination, messages) for i, s in enumerate(samples)]
    conversation = tuple(_as_dict(m) for m in messages) or tuple(dict(m) for m in episode.messages)
    return EpisodeResult(trajectories[0], conversation, tuple(trajectories[1:]))
