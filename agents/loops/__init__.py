"""Agent loops, chosen per row by ``agent_name`` (agents layer: pure asyncio).

``AGENT_LOOPS`` is the one table of loops; ``loop_for(name)`` resolves a row's ``agent_name`` (or the
config's ``default_agent_loop`` when the row has none) and ``run_episode`` runs one episode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agents.loops.base import AgentContext, AgentLoop, EpisodeResult, Generator, State
from agents.loops.episode import Episode, LoopLimits, episodes_for_row, row_reward, sample_seed
from agents.loops.single_turn import SingleTurnAgentLoop
from agents.loops.tool_agent import ToolAgentLoop

LoopRunner = Callable[[AgentContext, Episode], Awaitable[EpisodeResult]]


async def _single_turn(ctx: AgentContext, episode: Episode) -> EpisodeResult:
    return await SingleTurnAgentLoop(ctx, episode).run()


async def _tool_agent(ctx: AgentContext, episode: Episode) -> EpisodeResult:
    return await ToolAgentLoop(ctx, episode).run()


async def _langgraph_sql(ctx: AgentContext, episode: Episode) -> EpisodeResult:
    # Imported on use: langchain/langgraph take seconds to import and only this loop needs them.
    from agents.loops.langgraph_sql import run_langgraph_sql

    return await run_langgraph_sql(ctx, episode, **({"api_key": ctx.openai_api_key} if ctx.openai_api_key else {}))


async def _agent_lightning(ctx: AgentContext, episode: Episode) -> EpisodeResult:
    from agents.loops.agent_lightning import run_agent_lightning

    return await run_agent_lightning(ctx, episode)


AGENT_LOOPS: dict[str, LoopRunner] = {
    "single_turn_agent": _single_turn,
    "tool_agent": _tool_agent,
    "tool_agent_loop": _tool_agent,  # verl's name for the same loop
    "langgraph_sql": _langgraph_sql,
    "agent_lightning": _agent_lightning,
}


def loop_for(agent_name: str | None, default_agent_loop: str = "single_turn_agent") -> LoopRunner:
    """The loop for a row's ``agent_name`` (None or empty -> ``default_agent_loop``)."""
    name = agent_name or default_agent_loop
    try:
        return AGENT_LOOPS[name]
    except KeyError:
        raise ValueError(f"unknown agent_name {name!r}; expected one of {sorted(AGENT_LOOPS)}") from None


async def run_episode(ctx: AgentContext, episode: Episode, default_agent_loop: str = "single_turn_agent") -> EpisodeResult:
    """Run one episode with the loop its row names (``default_agent_loop`` when it names none)."""
    return await loop_for(episode.agent_name, default_agent_loop)(ctx, episode)


__all__ = [
    "AGENT_LOOPS", "AgentContext", "AgentLoop", "Episode", "EpisodeResult", "Generator", "LoopLimits", "State",
    "SingleTurnAgentLoop", "ToolAgentLoop", "episodes_for_row", "loop_for", "row_reward", "run_episode",
    "sample_seed",
]
