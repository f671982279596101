"""``tool_agent``: multi-turn tool use (agents layer: pure asyncio).

GENERATING -> parse the turn -> (ANSWERED | PARSE_ERROR | a turn limit) or PROCESSING_TOOLS, which runs
the calls concurrently, appends the tool messages as a masked chat-template delta and goes back to
GENERATING. Undecodable calls become error tool messages (``on_parse_error: feedback``) or end the
episode (``stop``); both are counted in ``num_parse_errors``. A tool call counts in ``num_tool_calls`` (and a
failed one in ``num_tool_errors``) only once it ran and its result reached the model: a call written in the
last allowed turn, or whose answer no longer fits the budget, never ran as far as the model can tell.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agents.chat import Message
from agents.loops.base import AgentLoop, State
from agents.loops.tool_calls import TIMEOUT_PREFIX, error_message, run_tool_calls, truncate_text
from agents.records import ParsedToolCalls, Termination


class ToolAgentLoop(AgentLoop):
    """The ``tool_agent`` loop (verl's ``tool_agent_loop``): generate, run the parsed tool calls, feed back their
    results, until the model answers or a turn limit ends the episode."""

    agent_name = "tool_agent"
    use_tools = True

    def handlers(self) -> dict[State, Callable[[], Awaitable[State]]]:
        return {**super().handlers(), State.PROCESSING_TOOLS: self.processing_tools}

    async def after_generation(self) -> State:
        parsed = self._traced_parse(self.p.last_text)
        self.p.last_parsed = parsed
        self.p.num_parse_errors += len(parsed.errors)
        limits = self.ctx.limits
        if not parsed.calls and not parsed.errors:
            return self.terminate(Termination.ANSWERED)
        if parsed.errors and limits.on_parse_error == "stop":
            return self.terminate(Termination.PARSE_ERROR)
        if limits.max_assistant_turns is not None and self.p.assistant_turns >= limits.max_assistant_turns:
            return self.terminate(Termination.MAX_ASSISTANT_TURNS)
        if limits.max_user_turns is not None and self.p.user_turns >= limits.max_user_turns:
            return self.terminate(Termination.MAX_USER_TURNS)
        return State.PROCESSING_TOOLS

    def _traced_parse(self, text: str) -> ParsedToolCalls:
        span = self.spans.start("parse", "PARSER", {"text": text})
        parsed = self.ctx.parse(text)
        self.spans.end(span, {"calls": [{"name": c.name, "arguments": c.arguments} for c in parsed.calls],
                              "errors": list(parsed.errors)})
        return parsed

    async def processing_tools(self) -> State:
        parsed = self.p.last_parsed
        assert parsed is not None, "processing_tools runs only after a parsed turn"
        limits = self.ctx.limits
        results = await run_tool_calls(
            self.ctx.tools, self.episode.trajectory_id, parsed.calls,
            max_parallel_calls=limits.max_parallel_calls, timeout_s=limits.tool_timeout_s, spans=self.spans,
            slots=self.ctx.tool_slots,
        )
        self.p.add("tool_s", sum(r.latency_s for r in results))
        self.p.add("num_tool_timeouts", sum(1 for r in results if r.error and r.error.startswith(TIMEOUT_PREFIX % r.name)))
        contents = [r.content for r in results]
        contents += [error_message(f"could not parse tool call: {e}") for e in parsed.errors]
        messages: list[Message] = [
            {"role": "tool", "content": truncate_text(c, limits.max_tool_response_length,
                                                      limits.tool_response_truncate_side)}
            for c in contents
        ]
        delta = self.ctx.chat.tool_delta_ids(self.p.last_output, messages)
        self.p.user_turns += 1
        if len(delta) > self.budget_left():
            return self.terminate(Termination.RESPONSE_BUDGET)
        if len(delta) > self.context_left():
            return self.terminate(Termination.MAX_MODEL_LEN)
        self.append_delta(delta)
        self.p.messages.extend(messages)
        self.p.num_tool_calls += len(results)  # these results reached the model
        self.p.num_tool_errors += sum(not r.ok for r in results)
        return State.GENERATING
