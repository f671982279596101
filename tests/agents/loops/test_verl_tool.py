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


def test_a_row_in_verls_gsm8k_multiturn_layout_trains_with_the_gsm8k_tool(qwen_tokenizer):
    """A row as verl's examples/data_preprocess/gsm8k_multiturn_w_tool.py writes it (system + user prompt,
    extra_info with split, index, need_tools_kwargs, tools_kwargs.calc_gsm8k_reward.create_kwargs and
    interaction_kwargs) loads, and its episode is scored by the GSM8K tool with the row's ground truth."""
    from agents.data.rows import DatasetRow
    from agents.loops import episodes_for_row
    from agents.records import SamplingParams
    from agents.tools.gsm8k import Gsm8kTool

    question = "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in total?"
    row = DatasetRow.model_validate({
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "system", "content": "You are a math expert. Use the calc_gsm8k_reward tool."},
                   {"role": "user", "content": question + " Let's think step by step and output the final answer "
                                                          "after `####`."}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24; 48 + 24 = 72\n#### 72", "question": question,
                       "need_tools_kwargs": True,
                       "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}},
                       "interaction_kwargs": {"query": question, "ground_truth": "72"}},
    })
    (episode,) = episodes_for_row(row, 1, SamplingParams(seed=1), group_id="g0", step=0,
                                  default_agent_loop="tool_agent")
    assert episode.tools_kwargs == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    turns = [say(qwen_tokenizer, call_text("calc_gsm8k_reward", '{"answer": "72"}')), say(qwen_tokenizer, "Done.")]
    tool = Gsm8kTool()
    ctx, _ = make_context(qwen_tokenizer, turns, [tool])
    traj = asyncio.run(ToolAgentLoop(ctx, episode).run()).trajectory
    assert traj.num_tool_calls == 1 and traj.reward == 1.0  # scored by the tool with the row's create_kwargs
