"""The agent-loop state machine driven by a scripted generator: every transition and every limit."""

from __future__ import annotations

import asyncio

import pytest

from agents.loops import SingleTurnAgentLoop, ToolAgentLoop
from agents.records import Termination
from agents.tools.calculator import CalculatorTool
from agents.tools.gsm8k import Gsm8kTool
from tests.agents.loops.scripted import (
    BarrierTool,
    BoomTool,
    EchoTool,
    SleepTool,
    Turn,
    assert_token_exact,
    call_text,
    make_context,
    make_episode,
    say,
)

CALC = call_text("calculator", '{"expression": "6*7"}')


def run(loop) -> object:
    return asyncio.run(loop.run())


@pytest.mark.unit
def test_single_turn_keeps_tokens_and_logprobs_and_scores(qwen_tokenizer) -> None:
    ctx, gen = make_context(qwen_tokenizer, [say(qwen_tokenizer, "6*7 = 42\n#### 42")])
    result = run(SingleTurnAgentLoop(ctx, make_episode(agent_name="single_turn_agent")))
    traj = result.trajectory
    assert traj.termination is Termination.EOS
    assert traj.response_ids == gen.results[0].token_ids
    assert traj.response_mask == (1,) * len(traj.response_ids)
    assert traj.reward == 1.0 and traj.num_turns == 1 and traj.agent_name == "single_turn_agent"
    # Single-turn prompts carry no tool schemas.
    assert "<tools>" not in qwen_tokenizer.decode(list(traj.prompt_ids))
    assert gen.requests[0].sampling.seed == 7 and gen.requests[0].trajectory_id == "g0-0"
    assert_token_exact(result, gen, qwen_tokenizer, [])


@pytest.mark.unit
def test_tool_agent_answers_without_tools(qwen_tokenizer) -> None:
    ctx, gen = make_context(qwen_tokenizer, [say(qwen_tokenizer, "#### 41")], [CalculatorTool()])
    traj = run(ToolAgentLoop(ctx, make_episode())).trajectory
    assert traj.termination is Termination.ANSWERED
    assert (traj.num_tool_calls, traj.num_tool_errors, traj.num_parse_errors, traj.reward) == (0, 0, 0, 0.0)
    assert "<tools>" in qwen_tokenizer.decode(list(traj.prompt_ids))


@pytest.mark.unit
def test_tool_turn_then_answer_is_token_exact(qwen_tokenizer) -> None:
    tools = [CalculatorTool()]
    turns = [say(qwen_tokenizer, CALC), Turn(say(qwen_tokenizer, "#### 42").token_ids, policy_version=3)]
    turns[0].policy_version = 2
    ctx, gen = make_context(qwen_tokenizer, turns, tools)
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    assert traj.termination is Termination.ANSWERED
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert result.messages[2]["content"] == "42"
    assert (traj.num_turns, traj.num_tool_calls, traj.num_tool_errors, traj.reward) == (2, 1, 0, 1.0)
    assert traj.policy_version == 2  # the oldest version that sampled any token
    # mask: turn 1 (1s), delta (0s), turn 2 (1s)
    n1, n2 = len(gen.results[0].token_ids), len(gen.results[1].token_ids)
    n_delta = len(traj.response_ids) - n1 - n2
    assert traj.response_mask == (1,) * n1 + (0,) * n_delta + (1,) * n2
    # the second request is the whole sequence so far
    assert gen.requests[1].prompt_ids == traj.prompt_ids + traj.response_ids[: n1 + n_delta]
    assert_token_exact(result, gen, qwen_tokenizer, tools)


@pytest.mark.unit
def test_max_assistant_turns_stops_before_running_tools(qwen_tokenizer) -> None:
    ctx, gen = make_context(qwen_tokenizer, [say(qwen_tokenizer, CALC)], [CalculatorTool()], max_assistant_turns=1)
    result = run(ToolAgentLoop(ctx, make_episode()))
    assert result.trajectory.termination is Termination.MAX_ASSISTANT_TURNS
    assert result.trajectory.response_mask == (1,) * len(gen.results[0].token_ids)
    assert_token_exact(result, gen, qwen_tokenizer, [CalculatorTool()])


@pytest.mark.unit
def test_max_user_turns_allows_exactly_that_many_tool_turns(qwen_tokenizer) -> None:
    turns = [say(qwen_tokenizer, CALC), say(qwen_tokenizer, CALC), say(qwen_tokenizer, "#### 42")]
    ctx, gen = make_context(qwen_tokenizer, turns, [CalculatorTool()], max_user_turns=1)
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    assert traj.termination is Termination.MAX_USER_TURNS
    assert traj.num_turns == 2 and traj.metrics["num_user_turns"] == 1.0 and len(gen.turns) == 1
    assert traj.num_tool_calls == 1  # both turns' calls were decoded; only the first ran (and counts)


@pytest.mark.unit
def test_parallel_calls_run_concurrently_up_to_the_cap(qwen_tokenizer) -> None:
    meet = call_text("meet", "{}")
    # Three calls, cap 2: the two allowed calls must be inside the barrier together (else both time
    # out); the third gets an error message.
    turns = [say(qwen_tokenizer, "\n".join([meet, meet, meet])), say(qwen_tokenizer, "#### 42")]
    tools = [BarrierTool(parties=2)]
    ctx, gen = make_context(qwen_tokenizer, turns, tools, max_parallel_calls=2, tool_timeout_s=30)
    result = run(ToolAgentLoop(ctx, make_episode()))
    contents = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert contents[:2] == ["met", "met"]
    assert contents[2].startswith("Error: too many tool calls in one turn: at most 2 run")
    assert (result.trajectory.num_tool_calls, result.trajectory.num_tool_errors) == (3, 1)
    assert_token_exact(result, gen, qwen_tokenizer, tools)


@pytest.mark.unit
def test_tool_timeout_becomes_error_message(qwen_tokenizer) -> None:
    turns = [say(qwen_tokenizer, call_text("sleep", '{"seconds": 30}')), say(qwen_tokenizer, "#### 42")]
    ctx, gen = make_context(qwen_tokenizer, turns, [SleepTool()], tool_timeout_s=0.05)
    result = run(ToolAgentLoop(ctx, make_episode()))
    assert result.messages[2]["content"] == "Error: tool 'sleep' timed out after 0.05 s"
    traj = result.trajectory
    assert (traj.num_tool_errors, traj.metrics["num_tool_timeouts"], traj.termination) == (
        1, 1.0, Termination.ANSWERED)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (call_text("nope", "{}"), "Error: unknown tool 'nope'; available tools: boom, calculator"),
        (call_text("boom", "{}"), "Error: tool 'boom' failed: RuntimeError: kaboom"),
        (call_text("boom", '{"kind": "tool_error"}'), "Error: boom: bad kind"),
        (call_text("calculator", '{"expression": "1/0"}'), None),
    ],
)
def test_tool_failures_become_error_messages(qwen_tokenizer, call: str, expected: str | None) -> None:
    tools = [BoomTool(), CalculatorTool()]
    ctx, gen = make_context(qwen_tokenizer, [say(qwen_tokenizer, call), say(qwen_tokenizer, "#### 42")], tools)
    result = run(ToolAgentLoop(ctx, make_episode()))
    content = result.messages[2]["content"]
    if expected is None:  # the calculator's own ToolError text
        assert content.startswith("Error: ") and "zero" in content.lower()
    else:
        assert content == expected
    assert result.trajectory.num_tool_errors == 1 and result.trajectory.termination is Termination.ANSWERED
    assert_token_exact(result, gen, qwen_tokenizer, tools)


@pytest.mark.unit
def test_parse_error_is_fed_back(qwen_tokenizer) -> None:
    bad = "<tool_call>\n{bad json\n</tool_call>"
    turns = [say(qwen_tokenizer, bad), say(qwen_tokenizer, "#### 42")]
    ctx, gen = make_context(qwen_tokenizer, turns, [CalculatorTool()])
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    assert result.messages[2]["content"].startswith("Error: could not parse tool call: <tool_call> block 1")
    assert (traj.num_parse_errors, traj.num_tool_calls, traj.termination) == (1, 0, Termination.ANSWERED)
    assert_token_exact(result, gen, qwen_tokenizer, [CalculatorTool()])


@pytest.mark.unit
def test_parse_error_stops_when_configured(qwen_tokenizer) -> None:
    turns = [say(qwen_tokenizer, "<tool_call>\n{bad json\n</tool_call>"), say(qwen_tokenizer, "#### 42")]
    ctx, gen = make_context(qwen_tokenizer, turns, [CalculatorTool()], on_parse_error="stop")
    traj = run(ToolAgentLoop(ctx, make_episode())).trajectory
    assert (traj.termination, traj.num_parse_errors, traj.num_turns) == (Termination.PARSE_ERROR, 1, 1)
    assert len(gen.turns) == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "...(truncated)...6789"),
        ("right", "0123...(truncated)..."),
        ("middle", "01...(truncated)...89"),
    ],
)
def test_tool_response_truncation_sides(qwen_tokenizer, side: str, expected: str) -> None:
    turns = [say(qwen_tokenizer, call_text("echo", '{"text": "0123456789"}')), say(qwen_tokenizer, "#### 42")]
    ctx, gen = make_context(
        qwen_tokenizer, turns, [EchoTool()], max_tool_response_length=4, tool_response_truncate_side=side
    )
    result = run(ToolAgentLoop(ctx, make_episode()))
    assert result.messages[2]["content"] == expected
    assert_token_exact(result, gen, qwen_tokenizer, [EchoTool()])


@pytest.mark.unit
def test_budget_is_shared_by_all_turns_and_tool_tokens(qwen_tokenizer) -> None:
    first = say(qwen_tokenizer, CALC)
    turns = [first, say(qwen_tokenizer, "Thinking hard about it. " * 30)]
    budget = 120
    ctx, gen = make_context(qwen_tokenizer, turns, [CalculatorTool()], max_response_length=budget)
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    n1 = len(first.token_ids)
    n_delta = len(traj.response_ids) - n1 - len(gen.results[1].token_ids)
    assert gen.requests[0].sampling.max_new_tokens == budget
    assert gen.requests[1].sampling.max_new_tokens == budget - n1 - n_delta
    assert len(traj.response_ids) == budget
    assert gen.results[1].finish_reason == "length" and traj.termination is Termination.RESPONSE_BUDGET
    assert_token_exact(result, gen, qwen_tokenizer, [CalculatorTool()])


@pytest.mark.unit
def test_tool_delta_over_the_budget_ends_without_appending(qwen_tokenizer) -> None:
    first = say(qwen_tokenizer, CALC)
    ctx, gen = make_context(
        qwen_tokenizer, [first, say(qwen_tokenizer, "#### 42")], [CalculatorTool()],
        max_response_length=len(first.token_ids) + 5,  # the delta is longer than 5 tokens
    )
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    assert traj.termination is Termination.RESPONSE_BUDGET
    assert traj.response_ids == tuple(first.token_ids) and len(gen.requests) == 1
    assert [m["role"] for m in result.messages] == ["user", "assistant"]


@pytest.mark.unit
def test_max_model_len_limits_each_turn(qwen_tokenizer) -> None:
    turn = say(qwen_tokenizer, "a long answer " * 40)
    ctx, gen = make_context(qwen_tokenizer, [turn], [CalculatorTool()], max_model_len=300, max_response_length=512)
    result = run(ToolAgentLoop(ctx, make_episode()))
    traj = result.trajectory
    prompt_len = len(traj.prompt_ids)
    assert gen.requests[0].sampling.max_new_tokens == 300 - prompt_len
    assert len(traj.prompt_ids) + len(traj.response_ids) == 300
    assert traj.termination is Termination.MAX_MODEL_LEN


@pytest.mark.unit
def test_prompt_longer_than_max_model_len_ends_before_generating(qwen_tokenizer) -> None:
    ctx, gen = make_context(qwen_tokenizer, [], [CalculatorTool()], max_model_len=50)
    traj = run(ToolAgentLoop(ctx, make_episode())).trajectory
    assert traj.termination is Termination.MAX_MODEL_LEN and traj.response_ids == () and gen.requests == []


@pytest.mark.unit
def test_engine_abort_ends_the_episode(qwen_tokenizer) -> None:
    aborted = Turn(say(qwen_tokenizer, "partial", eos=False).token_ids, finish_reason="abort")
    ctx, gen = make_context(qwen_tokenizer, [aborted], [CalculatorTool()])
    traj = run(ToolAgentLoop(ctx, make_episode())).trajectory
    assert traj.termination is Termination.ENGINE_ABORT and traj.response_ids == gen.results[0].token_ids


@pytest.mark.unit
def test_tool_derived_reward_when_the_row_configures_a_scoring_tool(qwen_tokenizer) -> None:
    answer = call_text("calc_gsm8k_reward", '{"answer": "42"}')
    turns = [say(qwen_tokenizer, answer), say(qwen_tokenizer, "Done, no final marker.")]
    tool = Gsm8kTool()
    ctx, gen = make_context(qwen_tokenizer, turns, [tool])
    episode = make_episode(tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "42"}}})
    traj = run(ToolAgentLoop(ctx, episode)).trajectory
    # The final text has no "#### 42", so the rule reward would be 0; the tool scored the proposal.
    assert traj.reward == 1.0
    assert tool._episodes == {}  # released


@pytest.mark.unit
@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_data_truncation_cuts_an_over_long_prompt_and_says_so_once(qwen_tokenizer, side, caplog) -> None:
    from agents.data.truncation import apply_prompt_limit
    from agents.loops import base

    base._truncation_logged.discard(side)
    question = "Please compute this carefully: " + "and then some more words " * 20 + "What is 6*7?"
    full = None
    for attempt in range(2):
        ctx, gen = make_context(qwen_tokenizer, [say(qwen_tokenizer, "#### 42")], [CalculatorTool()],
                                max_prompt_length=64, truncation=side)
        traj = run(ToolAgentLoop(ctx, make_episode(question=question))).trajectory
        ctx_full, _ = make_context(qwen_tokenizer, [], [CalculatorTool()])
        full = ctx_full.chat.prompt_ids([{"role": "user", "content": question}], [CalculatorTool().schema])
        assert len(full) > 64 and list(traj.prompt_ids) == apply_prompt_limit(full, 64, side, 0)
        assert gen.requests[0].prompt_ids == traj.prompt_ids  # what the model saw is what is trained
    said = [r for r in caplog.records if f"data.truncation={side}" in r.getMessage()]
    assert len(said) == 1 and f"{len(full)} tokens, cut to 64" in said[0].getMessage()


@pytest.mark.unit
def test_data_truncation_error_names_the_row(qwen_tokenizer) -> None:
    from agents.data.truncation import PromptTooLongError

    ctx, _ = make_context(qwen_tokenizer, [say(qwen_tokenizer, "#### 42")], [CalculatorTool()], max_prompt_length=32)
    with pytest.raises(PromptTooLongError, match="row g0-0: prompt has"):
        run(ToolAgentLoop(ctx, make_episode()))
