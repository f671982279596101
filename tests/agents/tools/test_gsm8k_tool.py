"""calc_gsm8k_reward: records the proposed answer, replies with feedback, rewards the last proposal."""

from __future__ import annotations

import asyncio

import pytest

from agents.tools.base import ToolError
from agents.tools.gsm8k import Gsm8kTool, normalize_answer


async def _episode(tool: Gsm8kTool, ground_truth, answers):
    await tool.create("ep", ground_truth=ground_truth)
    replies = [await tool.execute("ep", {"answer": a}) for a in answers]
    reward = await tool.calc_reward("ep")
    await tool.release("ep")
    return replies, reward


@pytest.mark.unit
def test_wrong_then_right_answer():
    replies, reward = asyncio.run(_episode(Gsm8kTool(), "72", ["70", "72"]))
    assert replies == ["Current parsed answer='70' reward=0.0", "Current parsed answer='72' reward=1.0"]
    assert reward == 1.0


@pytest.mark.unit
def test_reward_is_the_last_proposal():
    _, reward = asyncio.run(_episode(Gsm8kTool(), "72", ["72", "71"]))
    assert reward == 0.0


@pytest.mark.unit
@pytest.mark.parametrize("answer", ["1,200", "$1200", 1200, 1200.0, "#### 1200", "The answer is 1200.", "1200."])
def test_answer_forms_accepted(answer):
    # ground truth in GSM8K's raw form; flexible parsing takes the last number.
    _, reward = asyncio.run(_episode(Gsm8kTool(), "so she pays #### 1,200", [answer]))
    assert reward == 1.0


@pytest.mark.unit
def test_no_answer_yet_scores_zero_and_unknown_instance_fails():
    tool = Gsm8kTool()
    asyncio.run(tool.create("ep", ground_truth="3"))
    assert asyncio.run(tool.calc_reward("ep")) == 0.0
    with pytest.raises(KeyError, match="no episode 'other'"):
        asyncio.run(tool.execute("other", {"answer": "3"}))


@pytest.mark.unit
def test_bad_arguments():
    tool = Gsm8kTool()
    asyncio.run(tool.create("ep", ground_truth="3"))
    with pytest.raises(ToolError, match="missing argument 'answer'"):
        asyncio.run(tool.execute("ep", {}))
    with pytest.raises(ToolError, match="got a boolean"):
        asyncio.run(tool.execute("ep", {"answer": True}))
    with pytest.raises(ValueError, match="create needs ground_truth"):
        asyncio.run(tool.create("ep2"))


@pytest.mark.unit
def test_normalize_answer():
    assert normalize_answer(" $1,234 ") == "1234"
    assert normalize_answer(2.5) == "2.5"
    assert normalize_answer(7.0) == "7"
