"""verl's custom_reward_function: a user's file and function, called with verl's keyword arguments and
reward_kwargs, a float or verl's dict; it scores episodes in the agent loop (async functions too)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.loops import ToolAgentLoop
from agents.loops.episode import custom_reward
from agents.rewards import load_custom_reward
from configs import load_config
from tests.agents.loops.scripted import make_context, make_episode, say

pytestmark = pytest.mark.unit

SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    right = ground_truth in solution_str
    return {"score": (1.0 if right else 0.0) + bonus, "acc": float(right), "tool_calls": extra_info["num_tool_calls"]}

async def async_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5
'''


@pytest.fixture
def reward_file(tmp_path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_a_custom_reward_scores_the_episode_with_reward_kwargs(reward_file, qwen_tokenizer):
    cfg = load_config(None, [f"custom_reward_function.path={reward_file}", "reward_model.reward_kwargs={bonus: 0.25}"])
    chosen = cfg.reward_function
    assert (chosen.name, chosen.reward_kwargs) == ("compute_score", {"bonus": 0.25})
    ctx, _ = make_context(qwen_tokenizer, [say(qwen_tokenizer, "The answer is 42.")])
    ctx.reward = custom_reward(load_custom_reward(chosen.path, chosen.name, chosen.reward_kwargs))
    traj = asyncio.run(ToolAgentLoop(ctx, make_episode(ground_truth="42")).run()).trajectory
    assert traj.reward == 1.25 and traj.reward_extra == {"acc": 1.0, "tool_calls": 0.0}


def test_an_async_reward_is_awaited_and_bad_paths_fail_by_name(reward_file, qwen_tokenizer, tmp_path):
    ctx, _ = make_context(qwen_tokenizer, [say(qwen_tokenizer, "No idea.")])
    ctx.reward = custom_reward(load_custom_reward(str(reward_file), "async_score"))
    assert asyncio.run(ToolAgentLoop(ctx, make_episode()).run()).trajectory.reward == 0.5
    with pytest.raises(AttributeError, match="has no function 'nope'"):
        load_custom_reward(str(reward_file), "nope")
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path: no file"):
        load_custom_reward(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module\n")
    with pytest.raises(RuntimeError, match="broken.py: importing it failed"):
        load_custom_reward(str(broken))


def test_verl_09s_reward_section_and_its_other_keys_warn():
    with pytest.warns(UserWarning, match="reward: verl key accepted but not implemented by tandem-rl; ignored: num_workers"):
        cfg = load_config(None, ["reward.custom_reward_function.path=/x/r.py", "reward.num_workers=8"])
    assert cfg.reward_function.path == "/x/r.py"
    top = load_config(None, ["reward.custom_reward_function.path=/x/r.py", "custom_reward_function.path=/y/r.py"])
    assert top.reward_function.path == "/y/r.py"  # the top-level key wins
