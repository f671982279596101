"""``single_turn_agent``: one generation, no tools (agents layer: pure asyncio).

PENDING -> GENERATING -> TERMINATED (``EOS``, or a budget / engine termination).
"""

from __future__ import annotations

from agents.loops.base import AgentLoop


class SingleTurnAgentLoop(AgentLoop):
    """The ``single_turn_agent`` loop: one generation, no tools (rows that are answered in one reply)."""

    agent_name = "single_turn_agent"
    use_tools = False
