"""Safe arithmetic for the ``calculator`` tool (agents layer: pure, stdlib only).

The expression is parsed with ``ast`` and walked over an explicit table of operators; nothing is
``eval``-ed. Bounds keep one call cheap: the expression length, the exponent, and the size of every
intermediate value (``9**9**9`` would otherwise take minutes and gigabytes).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from agents.tools.base import Tool, ToolError

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1_000
MAX_ABS_VALUE = 1e100

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
# Operators people reach for that Python spells differently: a hint beats a bare "not allowed".
_HINTS: dict[type[ast.AST], str] = {
    ast.BitXor: "'^' is not a power here; use '**'",
    ast.Tuple: "remove thousands separators (write 1000, not 1,000)",
}


def _bounded(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    if abs(value) > MAX_ABS_VALUE:
        raise ToolError(f"a value exceeds the limit of {MAX_ABS_VALUE:g} in magnitude")
    return value


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent {exponent} exceeds the limit of {MAX_EXPONENT}")
    if base < 0 and not float(exponent).is_integer():
        raise ToolError("a negative number to a fractional power is not a real number")
    if base != 0 and exponent * math.log10(abs(base)) > math.log10(MAX_ABS_VALUE):
        raise ToolError(f"{base}**{exponent} exceeds the limit of {MAX_ABS_VALUE:g} in magnitude")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero (0 to a negative power)")
    return base**exponent


def _walk(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow):
            return _bounded(_power(left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        return _bounded(_BINARY[type(node.op)](left, right))
    kind = type(node.op) if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node)
    hint = _HINTS.get(kind, "only numbers, + - * / // % ** and parentheses are allowed")
    raise ToolError(f"unsupported syntax ({kind.__name__}): {hint}")


def format_number(value: Number) -> str:
    """Integers plainly; floats to 12 significant digits, integral floats without '.0'."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> Number:
    """Evaluate an arithmetic expression; raises ``ToolError`` with a reason the model can act on."""
    if not isinstance(expression, str) or not expression.strip():
        raise ToolError("expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"cannot parse {expression!r}: {getattr(exc, 'msg', exc)}") from None
    try:
        return _walk(tree)
    except RecursionError:
        raise ToolError("expression is nested too deeply") from None
    except OverflowError:
        raise ToolError(f"a value exceeds the limit of {MAX_ABS_VALUE:g} in magnitude") from None


class CalculatorTool(Tool):
    """``calculator(expression)``: stateless, so create/release keep nothing."""

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {"type": "string", "description": "For example '(12.5 - 2) * 3 / 7'."}
                    },
                    "required": ["expression"],
                },
            },
        }

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        expression = arguments.get("expression")
        if isinstance(expression, (int, float)) and not isinstance(expression, bool):
            expression = str(expression)
        if not isinstance(expression, str):
            raise ToolError(f"{self.name}: argument 'expression' must be a string")
        return format_number(calculate(expression))
