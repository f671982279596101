"""A verl ``BaseTool`` subclass named by its dotted path in a verl tool config runs unchanged inside tool_agent:
created per trajectory with the row's create_kwargs, executed (its text is the tool message, its step reward and
metrics kept), scoring the episode through calc_reward, released."""

from __future__ import annotations

import asyncio

import pytest

from agents.loops import ToolAgentLoop
from agents.tools.registry import load_tools
from tests.agents.loops.scripted import call_text, make_context, make_episode, say

pytestmark = pytest.mark.unit

CONFIG = {"tools": [{
    "class_name": "tests.agents.tools.verl_style_tool.AnswerCheckTool",
    "config": {"type": "native", "penalty": 0.1},
    "tool_schema": {"type": "function", "function": {
        "name": "check_answer", "description": "Check an answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
}]}


def test_a_verl_tool_runs_in_tool_agent_as_verl_drives_it(qwen_tokenizer):
    tools = load_tools(CONFIG)
    tool = tools["check_answer"]
    assert tool.inner.penalty == 0.1 and tool.scores_episodes
    turns = [say(qwen_tokenizer, call_text("check_answer", '{"answer": "41"}')),
             say(qwen_tokenizer, call_text("check_answer", '{"answer": "42"}')),
             say(qwen_tokenizer, "Done.")]
    ctx, _ = make_context(qwen_tokenizer, turns, list(tools.values()))
    episode = make_episode(tools_kwargs={"check_answer": {"create_kwargs": {"ground_truth": "42"}}})
    step_rewards = []
    original = tool.execute

    async def spy(instance_id, arguments):
        text = await original(instance_id, arguments)
        step_rewards.append(list(tool.step_rewards[instance_id]))
        return text
    tool.execute = spy
    result = asyncio.run(ToolAgentLoop(ctx, episode).run())
    traj = result.trajectory
    assert traj.num_tool_calls == 2 and traj.num_tool_errors == 0
    assert traj.reward == 1.0  # the tool's calc_reward scored the episode (the last text has no answer marker)
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages == ["Current parsed answer='41' result=0.0", "Current parsed answer='42' result=1.0"]
    assert step_rewards[-1] == [-0.1, 0.0]  # verl's step rewards, in call order
    assert tool.inner._instance_dict == {} and tool._instances == {}  # released


def test_a_verl_tool_without_a_schema_and_an_unknown_path_fail_naming_the_entry():
    entry = dict(CONFIG["tools"][0])
    entry.pop("tool_schema")
    with pytest.raises(ValueError, match=r"tools\[0\]: .*AnswerCheckTool is a verl BaseTool.*add a tool_schema"):
        load_tools({"tools": [entry]})
    with pytest.raises(ValueError, match=r"tools\[0\]: unknown class_name 'no_such_pkg.Tool'"):
        load_tools({"tools": [{"class_name": "no_such_pkg.Tool"}]})
    with pytest.raises(ValueError, match="neither a tandem-rl Tool nor a verl BaseTool"):
        load_tools({"tools": [{"class_name": "agents.tools.registry.load_tools"}]})
