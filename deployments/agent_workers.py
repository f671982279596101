"""Agent worker actors: many asyncio episodes per actor, generating through the rollout app (deployments layer).

An ``AgentWorker`` builds its tokenizer, tools and parser once, then ``run_rows(rows, step)`` runs every
row's ``n`` samples as concurrent asyncio tasks (at most ``max_concurrent_episodes`` at once). Each
generate goes through the ``RolloutServer`` DeploymentHandle with the trajectory id on the request, so
the sticky router keeps a trajectory on one replica. When all samples of a row are done, the group
(n ``Trajectory``s sharing a ``group_id``) is sent to the sink (``sink.put_group.remote(group)``), so the
trainer can start on early groups while slow ones still run. ``validate_rows`` runs validation rows through the
same loops, tools and rollout app with the validation sampling, and returns them scored instead of feeding the
trainer.

Tracing is injected as a factory (``observability.tracing`` builds the mlflow tracer): this layer never imports mlflow.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.serve.handle import DeploymentHandle

from agents.chat import ChatDelta
from agents.data.rows import DatasetRow
from agents.loops import AgentContext, Episode, EpisodeResult, LoopLimits, episodes_for_row, run_episode
from agents.loops.agent_lightning import AglClient, AglSettings
from agents.loops.agent_lightning_store import AglStoreClient
from agents.loops.episode import custom_reward
from agents.loops.tracing import NullTracer, Tracer
from agents.parsers import parse_tool_calls
from agents.records import GenerateRequest, GenerateResult, SamplingParams, ScoredSample, Termination, Trajectory
from agents.rewards import load_custom_reward
from agents.tools.registry import load_tools
from deployments.replica_retry import DEFAULT_MAX_RETRIES, call_surviving_deaths

log = logging.getLogger("tandem_rl.agents")

MAX_ACTOR_CONCURRENCY = 10_000  # run_rows calls and their episodes all live on the actor's event loop


class HandleGenerator:
    """``Generator`` over the ``RolloutServer`` DeploymentHandle (the request carries the trajectory id).

    A generate whose replica died is sent again (``max_retries`` times): the request is token-in with its own
    seed, so another replica regenerates the turn and the episode goes on; the router forgets the dead replica
    and re-sticks the trajectory. ``retries`` counts them.
    """

    def __init__(self, handle: DeploymentHandle, max_retries: int = DEFAULT_MAX_RETRIES):
        self.handle = handle
        self.max_retries = max_retries
        self.retries = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await call_surviving_deaths(lambda: self.handle.generate.remote(request),
                                           f"generate {request.request_id or request.trajectory_id!r}",
                                           self.max_retries, on_retry=self._count)

    def _count(self) -> None:
        self.retries += 1


@dataclass(frozen=True)
class AgentWorkerSpec:
    """What an agent worker needs from the config (built by ``from_config``)."""

    tokenizer_path: str
    limits: LoopLimits
    sampling: SamplingParams
    n: int
    parser_format: str = "qwen25_coder"
    tool_config_path: str | None = None
    default_agent_loop: str = "single_turn_agent"
    max_concurrent_episodes: int = 64
    openai_base_url: str = ""
    openai_api_key: str = field(default="", repr=False)  # the ingress's bearer token (serve.api_key_env), if any
    max_generate_retries: int = DEFAULT_MAX_RETRIES  # a generate whose replica died goes to another one this many times
    tool_env: dict[str, Any] = field(default_factory=dict)  # tools.env: into every tool's config
    tool_max_concurrency: int | None = None  # tools.max_concurrency: tool calls in flight per worker
    # a user's verl-style reward function: (file, function name, reward_kwargs); None = the built-in rewards
    reward_function: tuple[str, str, dict[str, Any]] | None = None
    agent_lightning: Any = None  # AglSettings: episodes run by Agent Lightning agents through agl-server

    @classmethod
    def from_config(cls, cfg: Any, *, tokenizer_path: str | None = None, openai_base_url: str = "",
                    openai_api_key: str = "") -> AgentWorkerSpec:
        """From a ``TandemConfig`` (``actor_rollout_ref.rollout``, ``data``, ``max_model_len``, model path)."""
        rollout = cfg.actor_rollout_ref.rollout
        model = cfg.actor_rollout_ref.model
        return cls(
            tokenizer_path=tokenizer_path or model.tokenizer_path or model.path,
            limits=LoopLimits.from_config(cfg),
            sampling=SamplingParams(
                temperature=rollout.temperature if rollout.do_sample else 0.0,
                top_p=rollout.top_p,
                top_k=rollout.top_k,
            ),
            n=rollout.n,
            parser_format=rollout.multi_turn.format,
            tool_config_path=cfg.tool_config_path,  # multi_turn.tool_config_path, else tools.config_path
            tool_env=dict(cfg.tools.env),
            tool_max_concurrency=cfg.tools.max_concurrency,
            default_agent_loop=rollout.agent.default_agent_loop,
            max_concurrent_episodes=rollout.agent.max_concurrent_episodes,
            openai_base_url=openai_base_url,
            openai_api_key=openai_api_key,
            agent_lightning=AglSettings.from_config(cfg.agent_lightning),
            reward_function=(None if cfg.reward_function is None else
                             (cfg.reward_function.path, cfg.reward_function.name, dict(cfg.reward_function.reward_kwargs))),
        )


def group_stats(groups: Sequence[Sequence[Trajectory]], elapsed_s: float) -> dict[str, float]:
    """Counts and means over finished groups (``termination/<reason>`` counts per reason)."""
    trajs = [t for g in groups for t in g]
    n = max(len(trajs), 1)
    stats: dict[str, float] = {
        "num_groups": float(len(groups)),
        "num_trajectories": float(len(trajs)),
        "reward_mean": sum(t.reward for t in trajs) / n,
        "response_length_mean": sum(len(t.response_ids) for t in trajs) / n,
        "num_turns_mean": sum(t.num_turns for t in trajs) / n,
        "num_tool_calls": float(sum(t.num_tool_calls for t in trajs)),
        "num_tool_errors": float(sum(t.num_tool_errors for t in trajs)),
        "num_parse_errors": float(sum(t.num_parse_errors for t in trajs)),
        "elapsed_s": elapsed_s,
        "episodes_per_s": len(trajs) / elapsed_s if elapsed_s > 0 else 0.0,
    }
    for reason, count in Counter(t.termination.value for t in trajs).items():
        stats[f"termination/{reason}"] = float(count)
    return stats


def _agl_client(spec: AgentWorkerSpec) -> AglClient | AglStoreClient | None:
    """Agent Lightning's side of the ``agent_lightning`` loop: a 1.x ``agl-server`` or a 0.3.x store."""
    settings = spec.agent_lightning
    if settings is None:
        return None
    if settings.store_url:
        return AglStoreClient(settings, spec.openai_base_url, spec.openai_api_key)
    return AglClient(settings, spec.openai_base_url)


class AgentWorkerImpl:
    """The plain class (tests can run it without Ray); ``AgentWorker`` is its Ray actor."""

    def __init__(
        self,
        spec: AgentWorkerSpec,
        rollout: DeploymentHandle,
        sink: ActorHandle,
        *,
        tracer_factory: Callable[[], Tracer] | None = None,
        run_id: str = "",
        worker_index: int = 0,
    ):
        from transformers import AutoTokenizer  # heavy; only inside the worker process

        tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path)
        self.tokenizer = tokenizer
        self.spec = spec
        self.sink = sink
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.worker_index = worker_index
        eos = tokenizer.eos_token_id
        self.sampling = SamplingParams(
            temperature=spec.sampling.temperature, top_p=spec.sampling.top_p, top_k=spec.sampling.top_k,
            stop_token_ids=(eos,) if eos is not None else (),
        )
        self.ctx = AgentContext(
            generator=HandleGenerator(rollout, max_retries=spec.max_generate_retries),
            chat=ChatDelta(tokenizer),
            parse=partial(parse_tool_calls, fmt=spec.parser_format),
            limits=spec.limits,
            tools=load_tools(spec.tool_config_path, spec.tool_env) if spec.tool_config_path else {},
            tool_slots=asyncio.Semaphore(spec.tool_max_concurrency) if spec.tool_max_concurrency else None,
            tracer=tracer_factory() if tracer_factory is not None else NullTracer(),
            **({} if spec.reward_function is None else {"reward": custom_reward(load_custom_reward(*spec.reward_function))}),
            run_id=self.run_id,
            openai_base_url=spec.openai_base_url,
            openai_api_key=spec.openai_api_key,
            agent_lightning=_agl_client(spec),
        )
        self._slots = asyncio.Semaphore(spec.max_concurrent_episodes)

    def episodes(self, row: DatasetRow, step: int, position: int, group_id: str | None = None) -> list[Episode]:
        group_id = group_id or f"{self.run_id}-w{self.worker_index}-s{step}-p{position}-r{row.extra_info.index}"
        return episodes_for_row(
            row, self.spec.n, self.sampling, group_id=group_id, step=step,
            default_agent_loop=self.spec.default_agent_loop,
        )

    async def _episode(self, episode: Episode) -> EpisodeResult:
        async with self._slots:
            return await run_episode(self.ctx, episode, self.spec.default_agent_loop)

    async def _group(self, row: DatasetRow, step: int, position: int, group_id: str | None) -> list[Trajectory]:
        results = await asyncio.gather(*(self._episode(e) for e in self.episodes(row, step, position, group_id)))
        group = [t for r in results for t in r.trajectories]
        await self.sink.put_group.remote(group)
        return group

    async def run_rows(self, rows: Sequence[DatasetRow | dict[str, Any]], step: int,
                       group_ids: Sequence[str] | None = None) -> dict[str, float]:
        """Run every row's group concurrently, emitting each group as it finishes; returns stats.

        ``group_ids`` names the groups (the coordinator's, so that it can abandon one in flight); by
        default they are made from the run, worker, step, position and row index. Cancelling the call
        (``ray.cancel``) cancels its episodes and their generate requests.
        """
        parsed = [r if isinstance(r, DatasetRow) else DatasetRow.model_validate(r) for r in rows]
        if group_ids is not None and len(group_ids) != len(parsed):
            raise ValueError(f"run_rows: {len(parsed)} rows but {len(group_ids)} group_ids")
        ids = list(group_ids) if group_ids is not None else [None] * len(parsed)
        started = time.perf_counter()
        groups = await asyncio.gather(*(self._group(row, step, i, ids[i]) for i, row in enumerate(parsed)))
        stats = group_stats(groups, time.perf_counter() - started)
        stats["generate_retries_total"] = float(self.ctx.generator.retries)  # this worker's, since it started
        return stats

    async def validate_rows(self, rows: Sequence[DatasetRow | dict[str, Any]], group_ids: Sequence[str], *, n: int,
                            sampling: SamplingParams, step: int) -> list[ScoredSample]:
        """Run ``n`` episodes of every row with ``sampling`` (validation's ``val_kwargs``) and return them scored
        and decoded, in row order; nothing goes to the trainer."""
        parsed = [r if isinstance(r, DatasetRow) else DatasetRow.model_validate(r) for r in rows]
        if len(group_ids) != len(parsed):
            raise ValueError(f"validate_rows: {len(parsed)} rows but {len(group_ids)} group_ids")
        sampling = replace(sampling, stop_token_ids=self.sampling.stop_token_ids)

        async def one_episode(row: DatasetRow, episode: Episode) -> ScoredSample:
            try:
                result = await self._episode(episode)
            except Exception as exc:  # one episode does not end the run: scored 0, counted as termination "failed"
                where = f"validation row {row.extra_info.index} ({row.data_source}, group {episode.group_id})"
                log.warning("%s: the episode failed, scored 0: %s: %s", where, type(exc).__name__, exc)
                return ScoredSample(data_source=row.data_source, uid=episode.group_id, input="",
                                    output=f"[episode failed: {type(exc).__name__}: {exc}]"[:2000], score=0.0,
                                    ground_truth=row.reward_model.ground_truth, num_turns=0,
                                    termination=Termination.FAILED.value)
            return self._scored(row, result.trajectory)  # outside the try: a scoring bug still fails loudly

        async def one_row(row: DatasetRow, group_id: str) -> list[ScoredSample]:
            episodes = episodes_for_row(row, n, sampling, group_id=group_id, step=step,
                                        default_agent_loop=self.spec.default_agent_loop, validation=True)
            return list(await asyncio.gather(*(one_episode(row, e) for e in episodes)))

        groups = await asyncio.gather(*(one_row(row, gid) for row, gid in zip(parsed, group_ids)))
        return [sample for group in groups for sample in group]

    def _scored(self, row: DatasetRow, trajectory: Trajectory) -> ScoredSample:
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)  # as verl decodes its dumps
        return ScoredSample(
            data_source=row.data_source, uid=trajectory.group_id, input=decode(list(trajectory.prompt_ids)),
            output=decode(list(trajectory.response_ids)), score=trajectory.reward,
            ground_truth=row.reward_model.ground_truth, reward_extra=dict(trajectory.reward_extra),
            num_turns=trajectory.num_turns, num_tool_calls=trajectory.num_tool_calls,
            num_tool_errors=trajectory.num_tool_errors, num_parse_errors=trajectory.num_parse_errors,
            response_length=sum(trajectory.response_mask), termination=str(trajectory.termination.value),
        )

    def node_id(self) -> str:
        """The Ray node this worker runs on (the driver logs where its agent workers landed)."""
        return ray.get_runtime_context().get_node_id()

    def flush_traces(self) -> None:
        """Write out traces still queued (call before reading them, or before the worker exits)."""
        self.ctx.tracer.flush()


AgentWorker = ray.remote(num_cpus=0, max_concurrency=MAX_ACTOR_CONCURRENCY)(AgentWorkerImpl)
"""The Ray actor class: ``AgentWorker.remote(spec, rollout_handle, sink, ...)``."""
