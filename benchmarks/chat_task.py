"""The demo task's tool chat as the load and fault benchmarks' clients run it: the calculator's OpenAI tool schema and
its answer to a model's call (no load tool imported here: ``serve_load_user`` is locust's, ``serve_faults`` runs
asyncio clients)."""

from __future__ import annotations

import json

from agents.tools.calculator import CalculatorTool, calculate, format_number

TOOLS = [CalculatorTool.default_schema()]
MAX_TURNS = 3


def calculator_answer(arguments: str) -> str:
    """The calculator's answer to a call's JSON arguments; a malformed call is data: its error goes back as the
    tool's answer."""
    try:
        return format_number(calculate(str(json.loads(arguments).get("expression", ""))))
    except Exception as exc:
        return f"error: {exc}"
