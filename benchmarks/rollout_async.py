"""Async agent loops vs verl's synchronous batch shape, on the same episodes (benchmarks).

    python -m benchmarks.rollout_async [--episodes 512] [--concurrency 128] [--max-batch-size 32] [--tool-turns 3]
                                       [--tokens-per-turn 16] [--sigmas 0.5 1.0 1.5] [--rounds 3]
                                       [--engine thread|process] [--torch-threads N]

Runs of the same episodes (same prompts, same per-sample seeds, same tool latencies) through the same
``tool_agent`` loop and one in-process ``HFEngine`` on the tiny model:

1. ``async, no tool latency``: the engine-bound limit;
2. ``async``: each tool call sleeps a lognormal latency (median = one generation turn, the time one full
   engine batch takes per turn in run 1; sigma: the long tail), drawn per (trajectory, call) so every run
   sees the same latencies; a new episode starts whenever a slot frees;
3. ``verl-sync``: verl 0.9's synchronous trainer (``AgentLoopManager.generate_sequences``): a batch of
   ``--concurrency`` episodes, each its own asyncio task with no barrier between turns, and one barrier at the
   end of the batch before the next starts. The baseline verl's users actually run;
4. ``lock-step``: a per-turn round barrier inside each batch (generate for all, then all tools, then generate
   again), the shape of a naive batched loop; a second, labelled line, not the baseline.

At sigma 1.0, the verdict's, runs 1-3 are repeated ``--rounds`` times, back to back, each round in a rotated order
(round 1: engine-bound, async, verl-sync; round 2: async, verl-sync, engine-bound; ...), and each mode's episodes
and seconds are pooled over the rounds. This box's speed drifts by a third within minutes; a ratio of runs taken
minutes apart (the engine-bound run used to be measured once, before every sigma) measured the drift as much as
the scheduling (three runs of one day: engine-bound 42.9 / 57.6 / 48.0 episodes/s). Each round's ratios are printed
as well, so the spread shows.

The workload is fixed so that only scheduling differs: every turn asks for ``--tokens-per-turn`` tokens
(``TurnCap``), and every turn calls the ``lookup`` tool (``always_call``) until ``max_assistant_turns``
ends the episode, so each episode makes ``tool_turns`` tool calls. The random tiny model's text is not
read. Episodes stream through ``--concurrency`` slots (an agent worker's ``max_concurrent_episodes``), more
than the engine's batch, so tool waits overlap with other episodes' generation. Engine busy fraction = share
of wall time with at least one generate in flight; 1 / the verl-sync run's busy fraction is the ceiling printed
next to each ratio: what removing the verl-sync run's idle engine time alone would gain. It is not a hard bound:
while busy, the verl-sync run also decodes thinner batches (fewer rows per step), so async can pass it.
Last line (sigma 1.0): ``async/verl-sync: X.XXx; async/engine-bound: X.XXx PASS|FAIL``, PASS when the first is >=
1.5 and the second >= 0.9. Before it, a profile per run from the engine's counters: rows per decode step, prefill
forwards, seconds by phase; and the async runs split where the last episode starts: while every slot holds an
episode, and the drain after it (a fixed set of episodes ends waiting on its slowest tool calls; a training run that
keeps streaming episodes has no such end), next to the least time the drain takes from the tool calls alone (the
latest of each episode's start plus its tool latencies, minus the split): no engine and no scheduler can end the run
sooner; and from it the most async/engine-bound could be on this run (every token before the split generated at the
engine-bound run's rate, the drain no longer than its tool calls force).

``--engine process`` puts the engine in its own process, as a rollout replica is in a real run, instead of a worker
thread beside the agent loops; ``--torch-threads`` sets its torch threads in either setting (default: torch's default
here, one in its own process). In one process the agents' Python (prompt deltas, parsing, tool calls) and the engine's
step take turns at one GIL; with episodes arriving at every step (async) that contention slows the engine's steps,
while the engine-bound run's turns arrive in cohorts between steps. Measured at equal thread counts, the engine in its
own process closes the full-phase gap at 1 and at 2 threads (README). The verdict keeps the in-process setting: its
engine-bound limit is the faster one (through the pipe the arrivals are staggered: more, smaller prefills and merges).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agents.chat import ChatDelta
from agents.loops import AgentContext, Episode, LoopLimits, run_episode, sample_seed
from agents.records import GenerateRequest, GenerateResult, ParsedToolCalls, SamplingParams, ToolCall
from agents.tools.base import Tool
from benchmarks.engine_process import EngineProcess

GOAL = "async/verl-sync >= 1.5x and async/engine-bound >= 0.9x at sigma 1.0"

QUESTIONS = ["How many customers live in Austin?", "What is 17 times 23?", "List the three largest claims.",
             "Which policy type is most common?", "What is the average premium?", "Who filed the first claim?"]


class EngineGenerator:
    """``Generator`` over an engine (in this process or its own) that records how long the engine had work."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.in_flight = 0
        self.busy_s = 0.0
        self.turn_s: list[float] = []
        self._busy_since = 0.0

    def busy_until(self, now: float) -> float:
        """Busy seconds so far, counting a busy span still open at ``now``."""
        return self.busy_s + (now - self._busy_since if self.in_flight else 0.0)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.in_flight == 0:
            self._busy_since = time.perf_counter()
        self.in_flight += 1
        started = time.perf_counter()
        try:
            out = await self.engine.generate(request.prompt_ids, request.sampling, request.request_id)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_s += time.perf_counter() - self._busy_since
        self.turn_s.append(time.perf_counter() - started)
        return GenerateResult(out.token_ids, out.logprobs, out.finish_reason, out.policy_version)


class TurnCap:
    """Every turn asks for the same number of tokens, so each run does the same engine work."""

    def __init__(self, inner: Any, tokens_per_turn: int):
        self.inner = inner
        self.tokens_per_turn = tokens_per_turn

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        capped = min(request.sampling.max_new_tokens, self.tokens_per_turn)
        result = await self.inner.generate(replace(request, sampling=replace(request.sampling, max_new_tokens=capped)))
        # A capped turn is a finished turn here (the loop would otherwise end the episode on "length").
        return replace(result, finish_reason="stop") if result.finish_reason == "length" else result


class RoundBarrier:
    """verl's batch shape: a round of generates is released only when every live episode has arrived."""

    def __init__(self, inner: Any, episodes: int):
        self.inner = inner
        self.live = episodes
        self.waiting: list[asyncio.Future] = []

    def _release_if_full(self) -> None:
        if self.waiting and len(self.waiting) >= self.live:
            for future in self.waiting:
                future.set_result(None)
            self.waiting = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        self._release_if_full()
        await future
        return await self.inner.generate(request)

    def leave(self) -> None:
        self.live -= 1
        self._release_if_full()


class LookupTool(Tool):
    """Sleeps a lognormal latency drawn from (trajectory, call number): identical in every run."""

    def __init__(self, median_s: float, sigma: float, seed: int = 0):
        super().__init__()
        self.median_s, self.sigma, self.seed = median_s, sigma, seed
        self.calls: dict[str, int] = {}

    @classmethod
    def default_schema(cls) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "lookup", "description": "Look something up.",
                                                 "parameters": {"type": "object", "properties": {}}}}

    def latency_s(self, instance_id: str, call: int) -> float:
        if self.median_s == 0:
            return 0.0
        rng = random.Random(f"{self.seed}/{instance_id}/{call}")
        return self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> str:
        call = self.calls.get(instance_id, 0)
        self.calls[instance_id] = call + 1
        await asyncio.sleep(self.latency_s(instance_id, call))
        return "ok"


def always_call(text: str) -> ParsedToolCalls:
    return ParsedToolCalls(calls=[ToolCall("lookup", {})], content=text)


def make_episodes(count: int) -> list[Episode]:
    return [
        Episode(trajectory_id=f"bench-{i}", group_id=f"bench-{i}",
                messages=({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},), agent_name="tool_agent",
                data_source="bench", ground_truth="", sampling=SamplingParams(seed=sample_seed(f"bench-{i}", 0)))
        for i in range(count)
    ]


@dataclass
class RunResult:
    name: str
    wall_s: float
    episodes: int
    busy_s: float
    mean_turn_s: float
    engine: dict[str, float]  # the engine's counters and phase seconds during this run
    # async shape: the same taken when the last episode started (before it every slot holds an episode)
    full: tuple[float, int, float, dict[str, float]] | None = None  # (seconds, episodes done, busy s, counters)
    # the earliest the run could end: each episode's start plus its tool calls' latencies, the latest of these
    tool_bound_s: float = 0.0

    def profile(self) -> str:
        """Where the engine's time went: rows per decode step, prefill forwards, seconds by phase."""
        e = self.engine
        return (f"{self.name}: {e['decode_rows'] / max(e['steps'], 1):.1f} rows per decode step, "
                f"{e['steps']:.0f} steps, {e['prefill_forwards']:.0f} prefill forwards; "
                f"decode {e['decode_s']:.1f} s, prefill {e['prefill_s']:.1f} s, merge {e['merge_s']:.1f} s, "
                f"outside the engine thread {self.wall_s - e['decode_s'] - e['prefill_s'] - e['merge_s']:.1f} s")

    def phases(self) -> str:
        """The run split where its last episode starts: before, every slot holds an episode; after, the slots
        empty one by one (the drain, which a stream of episodes that never ends would not have). Tokens per second
        compare equal work where episodes per second do not: at the split each run has its in-flight episodes at
        other turns."""
        if self.full is None:
            return f"{self.name}: no full/drain split"
        seconds, done, busy, e = self.full
        rest = {key: self.engine[key] - e[key] for key in e}

        def part(c: dict[str, float], wall: float, episodes: int, busy: float) -> str:
            inside = c["decode_s"] + c["prefill_s"] + c["merge_s"]
            return (f"{wall:.1f} s, {c['generated_tokens'] / wall:.0f} tokens/s, {episodes / wall:.2f} episodes/s, "
                    f"engine busy {busy / wall:.2f}, {c['decode_rows'] / max(c['steps'], 1):.1f} rows x "
                    f"{c['steps']:.0f} decode steps {c['decode_s']:.1f} s "
                    f"({c['decode_padding'] / max(c['decode_rows'], 1):.0f} padding positions per row), "
                    f"{c['prefill_forwards']:.0f} prefill forwards {c['prefill_tokens']:.0f} tokens "
                    f"+{c['prefill_padding']:.0f} padding {c['prefill_s']:.1f} s, outside the engine thread "
                    f"{wall - inside:.1f} s")
        return (f"{self.name}: all slots full {part(e, seconds, done, busy)}; draining "
                f"{part(rest, self.wall_s - seconds, self.episodes - done, self.busy_s - busy)}")

    def full_tokens_per_s(self) -> float:
        seconds, _, _, e = self.full
        return e["generated_tokens"] / seconds

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s

    @property
    def busy_fraction(self) -> float:
        return self.busy_s / self.wall_s


GOAL_VS_VERL, GOAL_VS_ENGINE = 1.5, 0.9
VERDICT_SIGMA = 1.0


def pool(runs: list[RunResult]) -> RunResult:
    """One mode's runs taken as one: episodes, seconds and counters summed (ratios of the sums weigh each run by
    its length, as one longer run would)."""
    def total(dicts: list[dict[str, float]]) -> dict[str, float]:
        return {key: sum(d[key] for d in dicts) for key in dicts[0]}

    fulls = [r.full for r in runs if r.full is not None]
    full = None
    if len(fulls) == len(runs) and fulls:
        full = (sum(f[0] for f in fulls), sum(f[1] for f in fulls), sum(f[2] for f in fulls), total([f[3] for f in fulls]))
    return RunResult(f"{runs[0].name} ({len(runs)} runs pooled)" if len(runs) > 1 else runs[0].name,
                     sum(r.wall_s for r in runs), sum(r.episodes for r in runs), sum(r.busy_s for r in runs),
                     sum(r.mean_turn_s * r.episodes for r in runs) / sum(r.episodes for r in runs),
                     total([r.engine for r in runs]), full, sum(r.tool_bound_s for r in runs))


def ratios(limit: RunResult, async_run: RunResult, verl_run: RunResult) -> str:
    return (f"async/verl-sync {async_run.episodes_per_s / verl_run.episodes_per_s:.2f}x (ceiling "
            f"{1 / verl_run.busy_fraction:.2f}x), async/engine-bound {async_run.episodes_per_s / limit.episodes_per_s:.2f}x")


def bounds(limit: RunResult, run: RunResult) -> str:
    """What async/engine-bound could reach if the async run lost no time to prefill (its prefill seconds cut to the
    engine-bound run's), and also none to an idle engine (time outside the engine thread cut likewise): the rest
    is decode steps with fewer rows, which tool latency causes whatever the engine does."""
    def outside(r: RunResult) -> float:
        return r.wall_s - r.engine["decode_s"] - r.engine["prefill_s"] - r.engine["merge_s"]

    prefill_gap = max(0.0, run.engine["prefill_s"] - limit.engine["prefill_s"])
    idle_gap = max(0.0, outside(run) - outside(limit))
    return (f"async/engine-bound if async prefilled as fast as the engine-bound run: at most "
            f"{limit.wall_s / (run.wall_s - prefill_gap):.2f}x; and with no idle engine either: at most "
            f"{limit.wall_s / (run.wall_s - prefill_gap - idle_gap):.2f}x")


def drain_floor(limit: RunResult, run: RunResult) -> str:
    """The most async/engine-bound could be if the async run generated its tokens before the split as fast as the
    engine-bound run generates (its whole-run tokens/s) and its drain took only what its tool calls force: an upper
    bound on this finite run, whatever the engine and the scheduler do."""
    seconds, _, _, counters = run.full
    best = counters["generated_tokens"] / (limit.engine["generated_tokens"] / limit.wall_s) + run.tool_bound_s - seconds
    return (f"async/engine-bound if every token before the split came at the engine-bound rate and the drain took only "
            f"its tool calls: at most {limit.wall_s / best:.2f}x")


async def run_mode(name: str, engine: Any, chat: ChatDelta, episodes: list[Episode], *, concurrency: int,
                   tool_turns: int, tokens_per_turn: int, median_s: float, sigma: float, shape: str) -> RunResult:
    """``async``: a new episode starts whenever one of ``concurrency`` slots frees (an agent worker's
    ``max_concurrent_episodes``). ``verl``: batches of ``concurrency`` free episodes, one barrier per batch.
    ``lockstep``: the same batches, each run in lock-step rounds (a barrier per turn)."""
    recorder = EngineGenerator(engine)
    generator: Any = TurnCap(recorder, tokens_per_turn)
    limits = LoopLimits(max_response_length=4096, max_model_len=8192, max_assistant_turns=tool_turns + 1)

    def context(gen: Any) -> AgentContext:
        return AgentContext(generator=gen, chat=chat, parse=always_call, limits=limits,
                            tools={"lookup": LookupTool(median_s, sigma)}, reward=lambda episode, text: 0.0)

    slots = asyncio.Semaphore(concurrency)
    done = [0]
    latency = LookupTool(median_s, sigma)
    tool_bound = [0.0]
    full: list[tuple[float, int, float, dict[str, float]]] = []

    async def one(ctx: AgentContext, episode: Episode, barrier: RoundBarrier | None) -> None:
        async with slots:
            waits = sum(latency.latency_s(episode.trajectory_id, call) for call in range(tool_turns))
            tool_bound[0] = max(tool_bound[0], time.perf_counter() - started + waits)
            if episode is episodes[-1] and shape == "async":
                now = time.perf_counter()
                stats = await stats_of(engine)
                full.append((now - started, done[0], recorder.busy_until(now),
                             {key: stats[key] - before[key] for key in stats}))
            try:
                await run_episode(ctx, episode)
            finally:
                done[0] += 1
                if barrier is not None:
                    barrier.leave()

    before = dict(await stats_of(engine))
    started = time.perf_counter()
    if shape in ("verl", "lockstep"):
        for first in range(0, len(episodes), concurrency):
            batch = episodes[first:first + concurrency]
            barrier = RoundBarrier(generator, len(batch)) if shape == "lockstep" else None
            ctx = context(barrier or generator)
            await asyncio.gather(*(one(ctx, e, barrier) for e in batch))
    else:
        ctx = context(generator)
        await asyncio.gather(*(one(ctx, e, None) for e in episodes))
    wall = time.perf_counter() - started
    after = await stats_of(engine)
    return RunResult(name, wall, len(episodes), recorder.busy_s, sum(recorder.turn_s) / len(recorder.turn_s),
                     {key: after[key] - before[key] for key in after}, full[0] if full else None, tool_bound[0])


async def stats_of(engine: Any) -> dict[str, float]:
    """The engine's counters: read in place from the in-process engine, asked for over the pipe from its own process."""
    return await engine.stats() if isinstance(engine, EngineProcess) else engine.stats


def _engine(model_dir: Path, batch: int, where: str, threads: int) -> Any:
    """``thread``: the engine in this process, its steps in a worker thread, the agents' Python beside them at one GIL
    (the verdict's setting; the faster engine-bound limit, since no pipe staggers arrivals). ``process``: the engine in
    its own process, as a rollout replica is in a real run (``benchmarks.engine_process``). ``threads``: its torch
    threads (in this process: set for the whole process)."""
    import torch

    from deployments.engines.hf_engine import HFEngine

    kwargs = dict(max_model_len=8192, max_batch_size=batch, eos_token_ids=())
    if where == "process":
        return EngineProcess(model_dir, num_threads=threads, **kwargs)
    torch.set_num_threads(threads)
    return HFEngine(str(model_dir), **kwargs)


async def main_async(args: argparse.Namespace) -> dict[float, list[RunResult]]:
    model_dir = Path(args.model) if args.model else _build_model()
    engine = _engine(model_dir, args.max_batch_size, args.engine, args.torch_threads)
    try:
        return await _modes(args, model_dir, engine)
    finally:
        if isinstance(engine, EngineProcess):
            engine.close()


async def _modes(args: argparse.Namespace, model_dir: Path, engine: Any) -> dict[float, list[RunResult]]:
    from transformers import AutoTokenizer

    chat = ChatDelta(AutoTokenizer.from_pretrained(model_dir))
    episodes = make_episodes(args.episodes)
    common = dict(concurrency=args.concurrency, tool_turns=args.tool_turns, tokens_per_turn=args.tokens_per_turn)
    await run_mode("warm-up", engine, chat, make_episodes(args.max_batch_size), median_s=0.0, sigma=1.0,
                   shape="async", **common)
    limit = await run_mode("async, no tool latency (calibration)", engine, chat, episodes, median_s=0.0, sigma=1.0,
                           shape="async",
                           **common)
    # One generation turn = the time a full engine batch takes for one turn in the engine-bound run
    # (batch slots / turns per second); an episode's own generate latency would also count queueing.
    turns = len(episodes) * (args.tool_turns + 1)
    median_s = args.max_batch_size * limit.wall_s / turns
    print(f"engine: {'in its own process' if args.engine == 'process' else 'in this process (a worker thread)'}, "
          f"{args.torch_threads} torch thread(s); "
          f"tool latency: lognormal, median {median_s * 1000:.0f} ms (= one generation turn)")
    runs: dict[float, list[RunResult]] = {}
    rounds: list[tuple[RunResult, RunResult, RunResult]] = []
    for sigma in args.sigmas:
        modes = [("async", "async"), ("verl-sync", "verl"), ("lock-step", "lockstep")]
        if sigma == VERDICT_SIGMA:
            trio = [("async, no tool latency", 0.0, "async"), (f"async, sigma {sigma}", median_s, "async"),
                    (f"verl-sync, sigma {sigma}", median_s, "verl")]
            for r in range(args.rounds):
                order = trio[r % 3:] + trio[:r % 3]
                done = {name: await run_mode(name, engine, chat, episodes, median_s=m, sigma=sigma, shape=shape,
                                             **common) for name, m, shape in order}
                rounds.append(tuple(done[name] for name, _, _ in trio))
                print(f"round {r + 1} ({', '.join(name.split(',')[0] if m else 'engine-bound' for name, m, _ in order)}):"
                      f" {ratios(*rounds[-1])}", flush=True)
            modes = modes[2:]
        runs[sigma] = [pool([r[i] for r in rounds]) for i in range(3)] if sigma == VERDICT_SIGMA else [limit]
        runs[sigma] += [await run_mode(f"{label}, sigma {sigma}", engine, chat, episodes, median_s=median_s,
                                       sigma=sigma, shape=shape, **common) for label, shape in modes]
    return runs


def _build_model() -> Path:
    from apps.make_tiny_model import build_tiny_model

    return build_tiny_model(Path(tempfile.mkdtemp(prefix="bench_tiny_")), seed=0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: build the tiny model)")
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=128, help="episodes in flight (sync: batch size)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="engine batch (episodes > batch keep it full)")
    parser.add_argument("--tool-turns", type=int, default=3)
    parser.add_argument("--tokens-per-turn", type=int, default=16)
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 1.5],
                        help="lognormal sigmas of the tool latency; the verdict is taken at 1.0")
    parser.add_argument("--engine", choices=("thread", "process"), default="thread",
                        help="thread: the engine in this process (the verdict's setting); process: in its own process, "
                             "as a rollout replica (the agents' Python no longer shares the engine's GIL)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="the engine's torch threads (default: torch's default for thread, 1 for process); set it "
                             "to compare the two settings at one thread count")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of engine-bound, async and verl-sync at sigma 1.0, each in a rotated order")
    args = parser.parse_args(argv)
    if VERDICT_SIGMA not in args.sigmas:
        parser.error(f"--sigmas must include {VERDICT_SIGMA} (the verdict's sigma)")
    if args.torch_threads is None:  # torch's default here for the engine in this process, one in its own
        import torch

        args.torch_threads = torch.get_num_threads() if args.engine == "thread" else 1
    if args.torch_threads < 1:
        parser.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    by_sigma = asyncio.run(main_async(args))
    print(f"{'mode':48s} {'episodes/s':>10s} {'engine busy':>11s} {'wall s':>7s}")
    for sigma, (limit, async_run, verl_run, lockstep) in by_sigma.items():
        shown = (limit, async_run, verl_run, lockstep) if sigma in (VERDICT_SIGMA, args.sigmas[0]) else (async_run, verl_run, lockstep)
        for run in shown:
            print(f"{run.name:48s} {run.episodes_per_s:10.2f} {run.busy_fraction:11.2f} {run.wall_s:7.2f}")
        print(f"sigma {sigma}: async/verl-sync {async_run.episodes_per_s / verl_run.episodes_per_s:.2f}x "
              f"(ceiling {1 / verl_run.busy_fraction:.2f}x = 1 / verl-sync engine busy), "
              f"async/lock-step {async_run.episodes_per_s / lockstep.episodes_per_s:.2f}x")
    limit, async_run, verl_run, _ = by_sigma[VERDICT_SIGMA]
    print(f"profile (sigma {VERDICT_SIGMA}, the rounds pooled):")
    for run in (limit, async_run, verl_run):
        print("  " + run.profile())
    print(bounds(limit, async_run))
    print(f"before and after the last episode starts (sigma {VERDICT_SIGMA}, the rounds pooled):")
    for run in (limit, async_run):
        print("  " + run.phases())
    print(f"async/engine-bound while every slot holds an episode: {async_run.full_tokens_per_s() / limit.full_tokens_per_s():.2f}x "
          f"tokens/s; the drain after it: {async_run.wall_s - async_run.full[0]:.1f} s async (its episodes' tool calls "
          f"alone need {async_run.tool_bound_s - async_run.full[0]:.1f} s of it) vs {limit.wall_s - limit.full[0]:.1f} s "
          f"engine-bound")
    print(drain_floor(limit, async_run))
    vs_verl = async_run.episodes_per_s / verl_run.episodes_per_s
    vs_engine = async_run.episodes_per_s / limit.episodes_per_s
    verdict = "PASS" if vs_verl >= GOAL_VS_VERL and vs_engine >= GOAL_VS_ENGINE else "FAIL"
    print(f"async/verl-sync: {vs_verl:.2f}x; async/engine-bound: {vs_engine:.2f}x {verdict}")


if __name__ == "__main__":
    main()
