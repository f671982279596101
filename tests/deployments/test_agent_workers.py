"""Agent workers and loops against the real rollout app (Ray Serve + HF engine + a tiny model that was
taught to call the SQL tools), real SQL tools on a real SQLite file, real mlflow traces."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.chat import ChatDelta, render_text
from agents.loops import AgentContext, LoopLimits, episodes_for_row, run_episode
from agents.parsers import parse_tool_calls
from agents.records import GenerateRequest, GenerateResult, SamplingParams, Termination
from agents.tools.registry import load_tools
from tests.deployments.agents_conftest_helpers import (  # noqa: F401  (session fixtures)
    SQL_TOOL_CONFIG,
    agents_ray,
    insurance_db_path,
    sql_model_dir,
    sql_rollout_app,
    sql_rows,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class RecordingGenerator:
    """Passes requests to the rollout handle and keeps each trajectory's results, in order."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.results: dict[str, list[GenerateResult]] = defaultdict(list)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.inner.generate(request)
        self.results[request.trajectory_id].append(result)
        return result


def _tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_token_exactness_over_200_tool_agent_trajectories(sql_rollout_app: dict, insurance_db_path: Path) -> None:
    from deployments.agent_workers import HandleGenerator

    tokenizer = _tokenizer(sql_rollout_app["model_dir"])
    tools = load_tools(SQL_TOOL_CONFIG)
    schemas = [t.schema for t in tools.values()]
    generator = RecordingGenerator(HandleGenerator(sql_rollout_app["rollout"]))
    ctx = AgentContext(
        generator=generator, chat=ChatDelta(tokenizer), parse=partial(parse_tool_calls, fmt="hermes"),
        limits=LoopLimits(max_response_length=160, max_model_len=4096, max_assistant_turns=3,
                          max_parallel_calls=2, max_tool_response_length=300),
        tools=tools,
    )
    sampling = SamplingParams(stop_token_ids=(tokenizer.eos_token_id,))
    episodes = [e for i, row in enumerate(sql_rows(insurance_db_path, 50, distinct=4))
                for e in episodes_for_row(row, 4, sampling, group_id=f"exact-{i}")]  # 3 taught + 1 new question

    async def run_all() -> list:
        return await asyncio.gather(*(run_episode(ctx, e) for e in episodes))

    results = asyncio.run(run_all())
    assert len(results) == 200
    eot_missing = ctx.chat.end_of_turn_missing
    for result in results:
        traj = result.trajectory
        returned = generator.results[traj.trajectory_id]
        sampled = [t for t, m in zip(traj.response_ids, traj.response_mask) if m == 1]
        assert sampled == [t for r in returned for t in r.token_ids], traj.trajectory_id
        assert [lp for lp, m in zip(traj.rollout_logprobs, traj.response_mask) if m == 1] == [
            lp for r in returned for lp in r.logprobs]
        # The conversation the loop recorded renders to exactly the text of prompt + response
        # (plus the end-of-turn text the template writes after the model's last turn).
        # An episode that stopped after a tool turn (no room left to generate) ends in an open assistant turn.
        text = tokenizer.decode(list(traj.prompt_ids) + list(traj.response_ids))
        messages = list(result.messages)
        if messages[-1]["role"] == "assistant":
            tail = tokenizer.decode(eot_missing(returned[-1].token_ids))
            assert text + tail == render_text(tokenizer, messages, schemas), traj.trajectory_id
        else:
            assert text == render_text(tokenizer, messages, schemas, add_generation_prompt=True), traj.trajectory_id
    by_reason = Counter(r.trajectory.termination for r in results)
    # The taught model calls the SQL tools: tool turns happened, on the real database.
    assert sum(r.trajectory.num_tool_calls for r in results) > 20
    tool_answers = [m["content"] for r in results for m in r.messages if m["role"] == "tool"]
    assert any("(1 rows)" in c for c in tool_answers)
    assert by_reason[Termination.ANSWERED] > 0
    assert sum(r.trajectory.reward for r in results) > 0


def test_agent_worker_emits_groups_to_the_sink_and_traces(sql_rollout_app: dict, insurance_db_path: Path,
                                                          tmp_path: Path) -> None:
    import mlflow
    import ray

    from observability.tracing import MlflowTracer, make_tracer
    from configs import load_config
    from deployments.agent_workers import AgentWorker, AgentWorkerSpec

    @ray.remote(num_cpus=0)
    class ListSink:
        def __init__(self) -> None:
            self.groups: list[list] = []

        def put_group(self, group: list) -> None:
            self.groups.append(group)

        def get(self) -> list[list]:
            return self.groups

    tool_config = tmp_path / "sql_tools.yaml"
    tool_config.write_text(yaml.safe_dump(SQL_TOOL_CONFIG))
    cfg = load_config(None, [
        "actor_rollout_ref.rollout.n=3",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "data.max_response_length=160",
    ])
    spec = AgentWorkerSpec.from_config(cfg, tokenizer_path=str(sql_rollout_app["model_dir"]))
    assert (spec.n, spec.limits.max_assistant_turns, spec.limits.max_response_length) == (3, 3, 160)
    uri = f"sqlite:///{tmp_path / 'traces.db'}"
    factory = partial(make_tracer, "mlflow", uri, token2text=True, max_samples_per_step=2,
                      experiment_name="worker-test")
    sink = ListSink.remote()
    worker = AgentWorker.remote(spec, sql_rollout_app["rollout"], sink, tracer_factory=factory, run_id="it")
    rows = [r.model_dump(mode="json") for r in sql_rows(insurance_db_path, 4, distinct=3)]
    stats = ray.get(worker.run_rows.remote(rows, 7), timeout=600)
    groups = ray.get(sink.get.remote())
    assert len(groups) == 4 and all(len(g) == 3 for g in groups)
    for group in groups:
        assert len({t.group_id for t in group}) == 1
        assert len({t.trajectory_id for t in group}) == 3
    assert stats["num_groups"] == 4.0 and stats["num_trajectories"] == 12.0
    assert sum(v for k, v in stats.items() if k.startswith("termination/")) == 12.0
    ray.get(worker.flush_traces.remote())

    tracer = MlflowTracer(uri, experiment_name="worker-test")
    traces = mlflow.search_traces(locations=[tracer.experiment_id], return_type="list")
    assert len(traces) == 2  # max_samples_per_step=2 for step 7
    assert {t.info.tags["step"] for t in traces} == {"7"}
    assert {t.info.tags["run_id"] for t in traces} == {"it"}
    spans = [s for t in traces for s in t.data.spans]
    assert {s.span_type for s in spans} >= {"AGENT", "LLM", "PARSER"}


def test_langgraph_sql_agent_trains_through_the_http_endpoint(sql_rollout_app: dict, insurance_db_path: Path) -> None:
    from langchain_core.utils.function_calling import convert_to_openai_tool

    from agents.loops.langgraph_sql import _langchain_tool, fetch_session
    from deployments.agent_workers import HandleGenerator

    tokenizer = _tokenizer(sql_rollout_app["model_dir"])
    tools = load_tools(SQL_TOOL_CONFIG)
    ctx = AgentContext(
        generator=HandleGenerator(sql_rollout_app["rollout"]), chat=ChatDelta(tokenizer), parse=partial(parse_tool_calls, fmt="hermes"),
        limits=LoopLimits(max_response_length=160, max_model_len=4096, max_assistant_turns=3), tools=tools,
        openai_base_url=sql_rollout_app["base_url"],
    )
    sampling = SamplingParams(temperature=1.0)
    episodes = [e for i, row in enumerate(sql_rows(insurance_db_path, 3, distinct=3))
                for e in episodes_for_row(row, 2, sampling, group_id=f"lg-{i}")]
    episodes = [replace(e, agent_name="langgraph_sql") for e in episodes]

    async def run_all() -> list:
        results = await asyncio.gather(*(run_episode(ctx, e) for e in episodes))
        sessions = await asyncio.gather(*(fetch_session(ctx.openai_base_url, e.trajectory_id) for e in episodes))
        return list(zip(results, sessions))

    outcomes = asyncio.run(run_all())
    schemas = [convert_to_openai_tool(_langchain_tool(ctx, t, "x")) for t in tools.values()]
    assert len(outcomes) == 6
    for result, calls in outcomes:
        trajs = result.trajectories
        assert all(t.agent_name == "langgraph_sql" for t in trajs)
        # Every sampled token of every recorded call is in exactly one sample, with mask 1, in order.
        sampled = [tok for t in trajs for tok, m in zip(t.response_ids, t.response_mask) if m == 1]
        assert sampled == [tok for c in calls for tok in c.response_ids]
        assert sum(t.num_turns for t in trajs) == len(calls) >= 1
        assert trajs[0].prompt_ids == calls[0].prompt_ids
        # The first prompt is the ingress's chat-template rendering of the row with the tool schemas.
        first_prompt = render_text(tokenizer, list(result.messages[:2]), schemas, add_generation_prompt=True)
        assert tokenizer.decode(list(calls[0].prompt_ids)) == first_prompt
    merged = [r for r, calls in outcomes if len(calls) > 1 and len(r.trajectories) == 1]
    assert merged, "no episode called a tool through LangGraph and merged its calls"
    for result in merged:  # tool turns merged: the masked extension holds the tool response
        traj = result.trajectory
        masked = [tok for tok, m in zip(traj.response_ids, traj.response_mask) if m == 0]
        assert "<tool_response>" in tokenizer.decode(masked)


def test_validation_runs_the_same_loops_greedy_is_repeatable_and_never_feeds_the_trainer(
        sql_rollout_app: dict, insurance_db_path: Path, tmp_path: Path) -> None:
    import ray

    from orchestration.validation import Validator, val_sampling
    from configs import load_config
    from deployments.agent_workers import AgentWorker, AgentWorkerSpec

    @ray.remote(num_cpus=0)
    class CountingSink:
        def __init__(self) -> None:
            self.count = 0

        def put_group(self, group: list) -> None:
            self.count += 1

        def get(self) -> int:
            return self.count

    tool_config = tmp_path / "sql_tools.yaml"
    tool_config.write_text(yaml.safe_dump(SQL_TOOL_CONFIG))
    cfg = load_config(None, [
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "data.max_response_length=160", "data.val_batch_size=3",
    ])
    assert val_sampling(cfg).temperature == 0.0  # verl's val_kwargs default: greedy, n=1
    spec = AgentWorkerSpec.from_config(cfg, tokenizer_path=str(sql_rollout_app["model_dir"]))
    sink = CountingSink.remote()
    workers = [AgentWorker.remote(spec, sql_rollout_app["rollout"], sink, run_id="val", worker_index=i)
               for i in range(2)]
    rows = [r.model_dump(mode="json") for r in sql_rows(insurance_db_path, 5, distinct=4)]
    validator = Validator.from_config(cfg, rows, workers, run_id="val")
    first, second = validator.run(0), validator.run(0)
    assert len(first.samples) == 5 and ray.get(sink.get.remote()) == 0  # nothing reached the trainer's buffer
    assert [(s.uid, s.output, s.score) for s in first.samples] == [(s.uid, s.output, s.score) for s in second.samples]
    assert [s.data_source for s in first.samples] == [r["data_source"] for r in rows]
    assert first.metrics == second.metrics
    source = rows[0]["data_source"]
    assert f"val-core/{source}/reward/mean@1" in first.metrics and "val-aux/num_turns/mean" in first.metrics
    sampled = Validator(rows, workers, n=3, sampling=val_sampling(load_config(None, [
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"])),
        batch_size=None, run_id="val").run(1)
    assert len(sampled.samples) == 15 and f"val-core/{source}/reward/mean@3" in sampled.metrics
