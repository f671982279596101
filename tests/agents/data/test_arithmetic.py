"""The demo arithmetic task: deterministic rows of two kinds, cold-start transcripts, a correctness-only reward
(``tests/agents/loops/test_reward_loopholes.py`` runs it through the real tool-agent loop)."""

import re

import pytest

from agents.data import arithmetic
from agents.data.rows import validate_row
from agents.parsers import parse_tool_calls

pytestmark = pytest.mark.unit


def test_rows_are_deterministic_valid_and_split_by_kind():
    a, b = arithmetic.make_rows(20, seed=5, split="train"), arithmetic.make_rows(20, seed=5, split="train")
    assert a == b
    assert arithmetic.make_rows(20, seed=5, split="val") != a
    for i, row in enumerate(a):
        validate_row(row, f"row {i}")
        assert row["agent_name"] == "tool_agent"
        expr = re.search(r"\d+ [+*] \d+", row["prompt"][0]["content"]).group(0)
        assert row["reward_model"]["ground_truth"] == str(arithmetic._evaluate(expr))
        hard = row["data_source"] == "tandem/arithmetic/hard"
        assert hard == (max(int(x) for x in expr.split()[::2]) >= 12)
    kinds = [r["data_source"] for r in arithmetic.make_rows(40, seed=1, split="val", hard_fraction=0.25)]
    assert kinds.count("tandem/arithmetic/hard") == 10 and kinds.count("tandem/arithmetic/easy") == 30
    with pytest.raises(ValueError, match="hard_fraction"):
        arithmetic.make_rows(4, seed=1, split="x", hard_fraction=2.0)


def test_evaluate_respects_precedence():
    assert arithmetic._evaluate("2 + 3 * 4") == 14
    assert arithmetic._evaluate("10 - 2 - 3") == 5
    assert arithmetic._evaluate("6 * 7 - 2 * 3") == 36


def test_transcripts_under_use_the_tool_and_answer_right():
    transcripts = arithmetic.make_sft_transcripts(400, seed=3, tool_schemas=[], tool_fraction=0.25)
    with_tool = [t for t in transcripts if t["call_format"] == "hermes"]
    assert 70 < len(with_tool) < 130
    for t in transcripts:
        expr = re.search(r"\d+ [+*] \d+", t["messages"][0]["content"]).group(0)
        value = arithmetic._evaluate(expr)
        assert arithmetic.extract_answer(t["messages"][-1]["content"]) == value
        if t["call_format"] == "none":
            assert [m["role"] for m in t["messages"]] == ["user", "assistant"]
            continue
        parsed = parse_tool_calls(t["messages"][1]["content"], "hermes")  # the format the template shows
        assert [(c.name, c.arguments) for c in parsed.calls] == [("calculator", {"expression": expr})]
        assert t["messages"][2] == {"role": "tool", "content": str(value)}
    assert all(t["call_format"] == "none" for t in arithmetic.make_sft_transcripts(20, 3, [], tool_fraction=0.0))
    with pytest.raises(ValueError, match="tool_fraction"):
        arithmetic.make_sft_transcripts(5, seed=3, tool_schemas=[], tool_fraction=1.5)


@pytest.mark.parametrize("text, expected", [
    ("The answer is 42.", 1.0),
    ("The answer is 41.", 0.0),              # a wrong number earns nothing, whatever came before
    ("I think it is 42", 0.0),               # no answer form
    ("answer is 7. The answer is 42.", 1.0),  # the last statement counts
    ("The answer is 4,2.", 1.0),              # thousands separators
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "42"}}\n</tool_call>', 0.0),
])
def test_score_answer_is_correctness_only(text, expected):
    assert arithmetic.score_answer(text, "42") == {"score": expected, "acc": expected}
