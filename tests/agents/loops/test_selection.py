"""Loop selection per row and the episodes of a row (group id, trajectory ids, seeds)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.data.rows import DatasetRow
from agents.data.sql_tasks import sql_row, sql_tasks
from agents.loops import AGENT_LOOPS, episodes_for_row, loop_for, run_episode
from agents.records import SamplingParams, Termination
from agents.tools.registry import load_tools
from tests.agents.loops.scripted import assert_token_exact, call_text, make_context, say


def _row(**extra: object) -> DatasetRow:
    return DatasetRow.model_validate({
        "data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "2+2?"}], "ability": "math",
        "reward_model": {"ground_truth": "4"}, "extra_info": {"index": 3, "question": "2+2?", "answer": "4"},
        **extra,
    })


@pytest.mark.unit
def test_agent_loop_table_and_default() -> None:
    assert set(AGENT_LOOPS) == {"single_turn_agent", "tool_agent", "tool_agent_loop", "langgraph_sql", "agent_lightning"}
    assert AGENT_LOOPS["tool_agent_loop"] is AGENT_LOOPS["tool_agent"]
    assert loop_for(None, "tool_agent") is AGENT_LOOPS["tool_agent"]
    assert loop_for("single_turn_agent", "tool_agent") is AGENT_LOOPS["single_turn_agent"]
    with pytest.raises(ValueError, match="unknown agent_name 'react'"):
        loop_for("react")


@pytest.mark.unit
def test_episodes_of_a_row_share_the_group_and_differ_in_id_and_seed() -> None:
    episodes = episodes_for_row(_row(), 4, SamplingParams(temperature=0.7), group_id="s1-r3", step=1,
                                default_agent_loop="tool_agent")
    assert {e.group_id for e in episodes} == {"s1-r3"}
    assert [e.trajectory_id for e in episodes] == ["s1-r3-0", "s1-r3-1", "s1-r3-2", "s1-r3-3"]
    assert len({e.sampling.seed for e in episodes}) == 4
    assert all(e.sampling.temperature == 0.7 and e.agent_name == "tool_agent" for e in episodes)
    # Same row, same group id -> same seeds (reproducible); an explicit agent_name wins over the default.
    again = episodes_for_row(_row(agent_name="single_turn_agent"), 4, SamplingParams(), group_id="s1-r3",
                             default_agent_loop="tool_agent")
    assert [e.sampling.seed for e in again] == [e.sampling.seed for e in episodes]
    assert {e.agent_name for e in again} == {"single_turn_agent"}


@pytest.mark.integration
def test_sql_episode_runs_real_tools_on_sqlite_and_scores_by_execution(qwen_tokenizer, insurance_db: Path) -> None:
    task = sql_tasks("insurance")[0]
    row = sql_row(task, insurance_db, 0, "train")
    tools = list(load_tools({"tools": [{"class_name": n} for n in ("search_schema", "get_columns", "execute_sql")]})
                 .values())
    query = task.sql.replace('"', '\\"')
    turns = [say(qwen_tokenizer, call_text("execute_sql", f'{{"query": "{query}"}}')),
             say(qwen_tokenizer, f"```sql\n{task.sql}\n```")]
    ctx, gen = make_context(qwen_tokenizer, turns, tools)
    (episode,) = episodes_for_row(row, 1, SamplingParams(), group_id="sql")
    result = asyncio.run(run_episode(ctx, episode))
    traj = result.trajectory
    assert (traj.termination, traj.num_tool_calls, traj.num_tool_errors, traj.reward) == (
        Termination.ANSWERED, 1, 0, 1.0)
    assert result.messages[3]["role"] == "tool" and "120" in result.messages[3]["content"]
    assert_token_exact(result, gen, qwen_tokenizer, tools)
