"""The demo reward through the real tool-agent loop: the old reward's format-credit loopholes score 0 now,
and a tool call counts only when it ran and its result reached the model."""

import asyncio

import pytest

from agents.loops import ToolAgentLoop
from agents.records import Termination
from agents.tools.calculator import CalculatorTool
from tests.agents.loops.scripted import call_text, make_context, make_episode, say

pytestmark = pytest.mark.unit


def _run(tokenizer, turns, **limits):
    ctx, _ = make_context(tokenizer, turns, [CalculatorTool()], **limits)
    episode = make_episode(question="What is 347 * 28?", data_source="tandem/arithmetic/hard", ground_truth="9716")
    return asyncio.run(ToolAgentLoop(ctx, episode).run()).trajectory


def test_loophole_unrelated_call_then_wrong_answer_scores_zero(qwen_tokenizer):
    turns = [say(qwen_tokenizer, call_text("calculator", '{"expression": "1"}')), say(qwen_tokenizer, "The answer is 5.")]
    traj = _run(qwen_tokenizer, turns)
    assert traj.num_tool_calls == 1 and traj.num_tool_errors == 0  # the call did run
    assert (traj.reward, traj.reward_extra) == (0.0, {"acc": 0.0})


def test_loophole_call_in_the_last_turn_never_ran_and_scores_zero(qwen_tokenizer):
    turns = [say(qwen_tokenizer, "The answer is 5. " + call_text("calculator", '{"expression": "347 * 28"}'))]
    traj = _run(qwen_tokenizer, turns, max_assistant_turns=1)
    assert traj.termination is Termination.MAX_ASSISTANT_TURNS
    assert traj.num_tool_calls == 0  # written, never executed: it does not count
    assert (traj.reward, traj.reward_extra) == (0.0, {"acc": 0.0})


def test_right_answer_after_the_tool_scores_one(qwen_tokenizer):
    turns = [say(qwen_tokenizer, call_text("calculator", '{"expression": "347 * 28"}')),
             say(qwen_tokenizer, "The answer is 9716.")]
    traj = _run(qwen_tokenizer, turns)
    assert traj.num_tool_calls == 1 and (traj.reward, traj.reward_extra) == (1.0, {"acc": 1.0})
