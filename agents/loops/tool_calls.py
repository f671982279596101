"""Running one turn's tool calls: concurrency cap, timeouts, errors as messages (agents layer: pure).

This is the fault boundary between the agent loop and tool code: any exception or timeout becomes a
``ToolResult`` with ``error`` set, whose content the model sees as the tool's answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Literal

from agents.loops.tracing import EpisodeSpans
from agents.records import ToolCall, ToolResult
from agents.tools.base import Tool, ToolError

TruncateSide = Literal["left", "right", "middle"]
TRUNCATION_MARK = "...(truncated)..."
TIMEOUT_PREFIX = "tool %r timed out"


def truncate_text(text: str, limit: int, side: TruncateSide) -> str:
    """Cut ``text`` to ``limit`` characters of its own plus a mark where text was dropped.

    ``left`` drops the start (keeps the end), ``right`` keeps the start, ``middle`` keeps
    ``limit // 2`` leading and ``limit - limit // 2`` trailing characters.
    """
    if len(text) <= limit:
        return text
    if side == "left":
        return TRUNCATION_MARK + text[len(text) - limit:]
    if side == "right":
        return text[:limit] + TRUNCATION_MARK
    if side == "middle":
        head = limit // 2
        tail = limit - head
        return text[:head] + TRUNCATION_MARK + (text[len(text) - tail:] if tail else "")
    raise ValueError(f"unknown tool_response_truncate_side {side!r}; expected left, right or middle")


def error_message(text: str) -> str:
    """How an error reads in the tool message the model sees."""
    return f"Error: {text}"


async def _run_one(
    tools: Mapping[str, Tool], instance_id: str, call: ToolCall, timeout_s: float, spans: EpisodeSpans,
    slots: asyncio.Semaphore | None = None,
) -> ToolResult:
    span = spans.start(f"tool:{call.name}", "TOOL", {"name": call.name, "arguments": call.arguments})
    started = time.perf_counter()
    tool = tools.get(call.name)
    error: str | None = None
    content = ""
    if tool is None:
        error = f"unknown tool {call.name!r}; available tools: {', '.join(sorted(tools)) or 'none'}"
    else:
        try:
            if slots is None:
                content = await asyncio.wait_for(tool.execute(instance_id, call.arguments), timeout=timeout_s)
            else:  # tools.max_concurrency: a call waits for a slot; the timeout counts from when it runs
                async with slots:
                    content = await asyncio.wait_for(tool.execute(instance_id, call.arguments), timeout=timeout_s)
        except asyncio.TimeoutError:
            error = f"{TIMEOUT_PREFIX % call.name} after {timeout_s:g} s"
        except ToolError as exc:
            error = str(exc) or type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - fault boundary: any tool failure becomes a message
            error = f"tool {call.name!r} failed: {type(exc).__name__}: {exc}"
    result = ToolResult(
        name=call.name,
        content=error_message(error) if error is not None else str(content),
        error=error,
        latency_s=time.perf_counter() - started,
        call_id=call.id,
    )
    spans.end(span, {"content": result.content}, error)
    return result


async def run_tool_calls(
    tools: Mapping[str, Tool],
    instance_id: str,
    calls: Sequence[ToolCall],
    *,
    max_parallel_calls: int,
    timeout_s: float,
    spans: EpisodeSpans,
    slots: asyncio.Semaphore | None = None,
) -> list[ToolResult]:
    """Run the first ``max_parallel_calls`` calls concurrently; later calls get an error result.

    Results come back in call order, so tool messages line up with the calls the model wrote.
    """
    allowed = list(calls[:max_parallel_calls])
    results = await asyncio.gather(*(_run_one(tools, instance_id, c, timeout_s, spans, slots) for c in allowed))
    for call in calls[max_parallel_calls:]:
        error = f"too many tool calls in one turn: at most {max_parallel_calls} run, {call.name!r} was skipped"
        results.append(ToolResult(name=call.name, content=error_message(error), error=error, call_id=call.id))
    return list(results)
