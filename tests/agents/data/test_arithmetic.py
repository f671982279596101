"""The demo arithmetic task: deterministic rows, mixed-format transcripts the universal parser reads, reward."""

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row
from agents.parsers import parse_tool_calls

pytestmark = pytest.mark.unit


def test_rows_are_deterministic_and_valid():
    a, b = arithmetic.make_rows(20, seed=5, split="train"), arithmetic.make_rows(20, seed=5, split="train")
    assert a == b
    assert arithmetic.make_rows(20, seed=5, split="val") != a
    for i, row in enumerate(a):
        validate_row(row, f"row {i}")
        assert row["agent_name"] == "tool_agent"


def test_evaluate_respects_precedence():
    assert arithmetic._evaluate("2 + 3 * 4") == 14
    assert arithmetic._evaluate("10 - 2 - 3") == 5
    assert arithmetic._evaluate("6 * 7 - 2 * 3") == 36


def test_transcripts_use_every_format_and_parse_with_qwen25_coder_only():
    transcripts = arithmetic.make_sft_transcripts(12, seed=1, tool_schemas=[])
    assert {t["call_format"] for t in transcripts} == set(arithmetic.CALL_FORMATS)
    hermes_hits = 0
    for t in transcripts:
        call_text = t["messages"][1]["content"]
        parsed = parse_tool_calls(call_text, "qwen25_coder")
        assert [c.name for c in parsed.calls] == ["calculator"], t["call_format"]
        expr = parsed.calls[0].arguments["expression"]
        assert str(arithmetic._evaluate(expr)) == t["messages"][2]["content"]
        hermes_hits += bool(parse_tool_calls(call_text, "hermes").calls)
    assert hermes_hits == 2  # only the hermes-format transcripts: the mixed formats need the universal parser


@pytest.mark.parametrize("text, calls, errors, expected", [
    ("The answer is 42.", 1, 0, 1.0),
    ("The answer is 42.", 0, 0, 1.0),        # right is right, tool or not
    ("The answer is 41.", 1, 0, 0.5),        # protocol followed, number wrong
    ("The answer is 41.", 0, 0, 0.0),        # no tool use: no partial credit
    ("The answer is 41.", 1, 1, 0.0),        # the only call failed
    ("I think it is 42", 1, 0, 0.0),         # no answer form
    ("answer is 7. The answer is 42.", 1, 0, 1.0),  # the last statement counts
])
def test_score_answer(text, calls, errors, expected):
    assert arithmetic.score_answer(text, "42", num_tool_calls=calls, num_tool_errors=errors) == expected
