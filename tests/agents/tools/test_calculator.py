"""calculator: arithmetic via ast, bounds and clear errors."""

from __future__ import annotations

import asyncio
import re

import pytest

from agents.tools.base import ToolError
from agents.tools.calculator import MAX_EXPRESSION_CHARS, CalculatorTool, calculate, format_number


@pytest.mark.unit
@pytest.mark.parametrize(
    "expression,expected",
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("-3 + 5", 2),
        ("+4 - -2", 6),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("0.1 * 3", 0.30000000000000004),
        ("1.5e3 + 0.5", 1500.5),
        ("-(2 ** 2)", -4),
    ],
)
def test_calculate(expression, expected):
    assert calculate(expression) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    "expression,message",
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 2000", "exponent 2000 exceeds"),
        ("9 ** 9 ** 9", "exponent 387420489 exceeds"),
        ("10 ** 101", "exceeds the limit of 1e+100"),
        ("0.001 ** -200", "exceeds the limit"),
        ("1e300", "exceeds the limit"),
        ("(-8) ** 0.5", "fractional power"),
        ("2 ^ 3", "use '**'"),
        ("1,000 + 1", "thousands separators"),
        ("__import__('os')", "unsupported syntax (Call)"),
        ("x + 1", "unsupported syntax (Name)"),
        ("'a' * 3", "unsupported syntax (Constant)"),
        ("True + 1", "unsupported syntax (Constant)"),
        ("2 < 3", "unsupported syntax (Compare)"),
        ("1 +", "cannot parse"),
        ("", "non-empty"),
        ("1" + "+1" * MAX_EXPRESSION_CHARS, "the limit is 500"),
        ("(" * 220 + "1" + ")" * 220, "too many nested parentheses"),
    ],
)
def test_calculate_refuses(expression, message):
    with pytest.raises(ToolError, match=re.escape(message)):
        calculate(expression)


@pytest.mark.unit
@pytest.mark.parametrize("value,text", [(3, "3"), (3.0, "3"), (0.1 + 0.2, "0.3"), (1 / 3, "0.333333333333"), (1e20, "1e+20")])
def test_format_number(value, text):
    assert format_number(value) == text


@pytest.mark.unit
def test_calculator_tool():
    tool = CalculatorTool()
    assert tool.name == "calculator"
    assert asyncio.run(tool.execute("ep", {"expression": "(48 / 2) + 48"})) == "72"
    assert asyncio.run(tool.execute("ep", {"expression": 12})) == "12"
    with pytest.raises(ToolError, match="argument 'expression' must be a string"):
        asyncio.run(tool.execute("ep", {"expr": "1"}))
