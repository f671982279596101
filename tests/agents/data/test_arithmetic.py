"""The demo arithmetic task: deterministic rows, mixed-format transcripts the universal parser reads, reward."""

import re

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


def test_direct_fraction_mixes_in_tool_free_answers():
    transcripts = arithmetic.make_sft_transcripts(400, seed=3, tool_schemas=[], direct_fraction=0.5)
    direct = [t for t in transcripts if t["call_format"] == "none"]
    assert 150 < len(direct) < 250
    for t in direct:  # question, then the right answer at once
        assert [m["role"] for m in t["messages"]] == ["user", "assistant"]
        expr = re.search(r"\d[\d +*-]*\d", t["messages"][0]["content"]).group(0)
        assert arithmetic.extract_answer(t["messages"][1]["content"]) == arithmetic._evaluate(expr)
    with_tool = [t for t in transcripts if t["call_format"] != "none"]
    assert {t["call_format"] for t in with_tool} == set(arithmetic.CALL_FORMATS)
    assert all(t["call_format"] != "none" for t in arithmetic.make_sft_transcripts(50, seed=3, tool_schemas=[]))
    with pytest.raises(ValueError, match="direct_fraction"):
        arithmetic.make_sft_transcripts(5, seed=3, tool_schemas=[], direct_fraction=1.5)


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
