"""Agent-loop traces written by the mlflow tracer (real mlflow, sqlite store) and read back."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from agents.loops import ToolAgentLoop
from agents.tools.calculator import CalculatorTool
from tests.agents.loops.scripted import call_text, make_context, make_episode, say


@pytest.mark.integration
@pytest.mark.slow
def test_episode_spans_are_readable_with_search_traces(qwen_tokenizer, tmp_path: Path) -> None:
    import mlflow

    from observability.tracing import MlflowTracer

    tracer = MlflowTracer(f"sqlite:///{tmp_path / 'mlruns.db'}", experiment_name="loops-test",
                          token2text=True, max_samples_per_step=2)
    call = call_text("calculator", '{"expression": "6*7"}')
    script = [say(qwen_tokenizer, call), say(qwen_tokenizer, "#### 42")] * 3
    ctx, gen = make_context(qwen_tokenizer, script, [CalculatorTool()])
    ctx.tracer, ctx.run_id = tracer, "run-1"

    async def three_episodes() -> None:
        for i in range(3):  # one after another: the scripted turns are consumed in order
            episode = replace(make_episode(), trajectory_id=f"g0-{i}", sample_index=i, step=5)
            await ToolAgentLoop(ctx, episode).run()

    asyncio.run(three_episodes())
    tracer.flush()
    traces = mlflow.search_traces(locations=[tracer.experiment_id], return_type="list")
    assert len(traces) == 2  # max_samples_per_step caps step 5 at two episodes
    by_index = {t.info.tags["sample_index"]: t for t in traces}
    assert sorted(by_index) == ["0", "1"]
    trace = by_index["0"]
    assert {k: trace.info.tags[k] for k in ("step", "agent_name", "run_id", "trajectory_id")} == {
        "step": "5", "agent_name": "tool_agent", "run_id": "run-1", "trajectory_id": "g0-0"}
    spans = {(s.name, s.span_type) for s in trace.data.spans}
    assert spans == {("agent_loop", "AGENT"), ("generate", "LLM"), ("parse", "PARSER"),
                     ("tool:calculator", "TOOL")}
    root = next(s for s in trace.data.spans if s.name == "agent_loop")
    assert root.outputs["termination"] == "answered" and root.outputs["reward"] == 1.0
    assert all(s.parent_id == root.span_id for s in trace.data.spans if s is not root)
    tool = next(s for s in trace.data.spans if s.span_type == "TOOL")
    assert tool.inputs == {"name": "calculator", "arguments": {"expression": "6*7"}}
    assert tool.outputs == {"content": "42"}
    generates = [s for s in trace.data.spans if s.name == "generate"]
    assert len(generates) == 2
    assert generates[0].outputs["text"] == qwen_tokenizer.decode(list(gen.results[0].token_ids))
    assert generates[0].inputs["prompt_text"].endswith("<|im_start|>assistant\n")
