"""GSM8K-style rows: final-answer extraction, record errors, reasoning-gym problems, verl row shape."""

import pytest

from agents.data.gsm8k import (
    GSM8K_TOOL,
    MathProblem,
    gsm8k_final_answer,
    math_row,
    problems_from_gsm8k_records,
    problems_from_reasoning_gym,
)
from agents.data.rows import DataError

PROBLEM = MathProblem("What is 2 + 3?", ground_truth="5", solution="2 + 3 = 5\n#### 5", data_source="x")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("answer", "expected"),
    [("He pays 3 * 4 = 12.\n#### 12", "12"), ("#### 1,234", "1234"), ("x\n#### -7.5 ", "-7.5")],
)
def test_final_answer_after_hashes(answer, expected):
    assert gsm8k_final_answer(answer, "f row 0") == expected


@pytest.mark.unit
def test_records_errors_name_source_row_and_key():
    good = {"question": "q", "answer": "#### 1"}
    with pytest.raises(DataError, match="^gsm.jsonl row 1: missing key 'answer'$"):
        problems_from_gsm8k_records([good, {"question": "q"}], "gsm.jsonl")
    with pytest.raises(DataError, match="^gsm.jsonl row 0: key 'question' must be a string, got int$"):
        problems_from_gsm8k_records([{"question": 3, "answer": "#### 1"}], "gsm.jsonl")
    with pytest.raises(DataError, match="^gsm.jsonl row 2: key 'answer' has no '#### <number>'"):
        problems_from_gsm8k_records([good, good, {"question": "q", "answer": "42"}], "gsm.jsonl")


@pytest.mark.unit
def test_reasoning_gym_problems_are_deterministic_distinct_and_labelled():
    first = problems_from_reasoning_gym(["gsm_symbolic", "basic_arithmetic"], count=6, seed=3)
    again = problems_from_reasoning_gym(["gsm_symbolic", "basic_arithmetic"], count=6, seed=3)
    other_seed = problems_from_reasoning_gym(["gsm_symbolic", "basic_arithmetic"], count=6, seed=4)
    assert first == again
    assert first != other_seed
    assert len({p.question for p in first}) == 6
    sources = [p.data_source for p in first[:2]]
    assert sources == ["reasoning_gym/gsm_symbolic", "reasoning_gym/basic_arithmetic"]
    assert all(p.ground_truth and "," not in p.ground_truth for p in first)


@pytest.mark.unit
def test_tool_agent_row_carries_the_reward_tool_kwargs():
    row = math_row(PROBLEM, index=7, split="val", agent_name="tool_agent")
    assert row.agent_name == "tool_agent"
    assert [m.role for m in row.prompt] == ["system", "user"]
    assert GSM8K_TOOL in row.prompt[0].content
    assert row.prompt[1].content.startswith("What is 2 + 3?")
    assert row.reward_model.ground_truth == "5"
    assert row.extra_info.tools_kwargs == {GSM8K_TOOL: {"create_kwargs": {"ground_truth": "5"}}}
    info = row.extra_info
    assert (info.index, info.split, info.answer) == (7, "val", "2 + 3 = 5\n#### 5")


@pytest.mark.unit
def test_single_turn_row_has_no_tools():
    row = math_row(PROBLEM, index=0, split="train", agent_name="single_turn_agent")
    assert [m.role for m in row.prompt] == ["user"]
    assert row.extra_info.tools_kwargs == {}


@pytest.mark.integration
def test_verl_gsm8k_scorer_accepts_the_ground_truths():
    from verl.utils.reward_score import gsm8k

    for problem in problems_from_reasoning_gym(["gsm_symbolic", "basic_arithmetic"], count=20, seed=0):
        assert gsm8k.compute_score(f"... so\n#### {problem.ground_truth}", problem.ground_truth) == 1.0
