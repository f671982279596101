"""Streaming vs batch-synchronous GRPO on a long-tailed response-length mix: trained response tokens per wall
second, and whether streaming trains the long samples as often as it generates them. All modes in one run.

Real parts: ``HFEngine`` generation (step-level batching) on a random tiny Qwen2, the ``AdmissionController``
(AReaL's capacity rule) and ``TrajectoryBuffer`` (a bounded queue, first complete groups win), the real GRPO
step (``trainers.step.train_step``, FSDP2 over one gloo rank) and real weight sync: after every step the
learner writes its LoRA adapter and the engine loads it before admission hears the new version. As in a
real run, the engine has its own process (a rollout replica) and the learner another (a Ray Train
worker), one core each; Ray itself is left out so that only the scheduling differs between the modes.
Response lengths are drawn per sample from a long-tailed mix (85% 16-48 tokens, 15% 512-1024: agent
episodes that hit tool loops) and forced by ``max_new_tokens`` with EOS disabled; every mode sees the
same sequence of groups and lengths.

- sync: generate every group of the batch (the slowest decides), train, sync weights; no generation
  while training (verl's synchronous trainer).
- stream: admission runs ``--max-staleness`` (default 2) versions ahead; every admitted group finishes and is
  trained; weight syncs interrupt running generations, which continue with the new adapter (partial rollouts,
  the defaults ``stream.partial_rollout: true``, ``stream.abort_stale: false``).
- stream-drain: the same, but a weight sync waits for the running generations to finish
  (``stream.partial_rollout: false``): shows what one long generation costs every sync.
- stream-abort: the older behaviour (``stream.abort_stale: true``): groups that can no longer be fresh are
  aborted or dropped. Faster per step because it trains shorter samples: the long-share columns show it.
- stream-fixed: stream, but the data are exactly the ``steps x groups`` groups sync trains, so every one of them is
  trained and the last steps wait for the set's slowest groups. Sync's wall time over stream-fixed's is the speed-up
  on equal work with nothing dropped and no window edge: a stream cut off after ``steps`` steps leaves its slowest
  (most often long) groups running, and trained tokens per second over such a window favours the short groups that
  finished first (the "started" long share, next to "generated", shows how much).

The headline is trained response tokens per wall second (steps 2..; the first includes warm-up everywhere).
"Generated" long share is over the samples of every group whose generation ended (finished, aborted or
dropped; not those still running when a mode stops), the long threshold the 90th percentile of those lengths. Before
the last line, the fixed-set wall times (``a fixed set of N groups, every one trained ...: stream/sync X.XXx``, no
goal). Last line: ``stream/sync trained tokens/s: X.XXx (long share trained A% vs generated B%) PASS|FAIL``; PASS when
the ratio is >= 2.0 and stream's trained long share is within 2 points of the generated one.

    python -m benchmarks.stream_vs_sync [--steps 8] [--groups 4] [--n 4] [--max-staleness 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from agents.records import AdapterRef, SamplingParams, Trajectory
from benchmarks.engine_process import EngineProcess
from configs import load_config
from deployments.engines.hf_engine import SwapMode
from trainers.admission import AdmissionController
from trainers.buffer import TrajectoryBuffer, long_share, long_threshold
from trainers.model import build_policy, gather_adapter, save_adapter
from trainers.step import StepSettings, train_step
from trainers.optim import build_optimizer, make_scheduler

GOAL = "stream/sync trained tokens/s >= 2.0x, long share trained within 2 points of generated"

VOCAB, PROMPT, MAX_RESPONSE = 1000, 48, 1024
MODES: dict[str, SwapMode] = {"sync": "drain", "stream": "interrupt", "stream-drain": "drain",
                             "stream-abort": "interrupt", "stream-fixed": "interrupt"}
GOAL_RATIO, LONG_SHARE_POINTS = 2.0, 2.0


def lengths_for(group: int, n: int) -> list[int]:
    rng = random.Random(group)
    return [rng.randint(MAX_RESPONSE // 2, MAX_RESPONSE) if rng.random() < 0.15 else rng.randint(16, 48) for _ in range(n)]


class Run:
    def __init__(self, engine: EngineProcess, model_dir: Path, adapter_dir: Path, args: argparse.Namespace):
        self.engine, self.adapter_dir = engine, adapter_dir
        self.groups, self.n, self.steps = args.groups, args.n, args.steps
        self.trained_lengths: list[int] = []
        self.trained_by_step: list[int] = []  # response tokens trained per step
        self.settled_groups: list[int] = []  # groups whose generation ended: finished, or aborted in flight
        self.started_groups = 0  # groups whose generation started (0..started_groups - 1)
        self.sync_s: list[float] = []
        self.wait_s: list[float] = []  # waiting for rollouts (sync: generating the batch)
        self.train_s: list[float] = []  # GRPO step + writing the adapter
        self.accounting = ""
        cfg = load_config(None, [
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
            f"data.train_batch_size={self.groups}", f"actor_rollout_ref.actor.ppo_mini_batch_size={self.groups}",
            f"data.max_response_length={MAX_RESPONSE}", f"actor_rollout_ref.rollout.n={self.n}",
        ])
        actor, cpu = cfg.actor_rollout_ref.actor, torch.device("cpu")
        self.model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, cpu, seed=0)
        self.optimizer = build_optimizer(self.model, actor.optim)
        self.scheduler = make_scheduler(self.optimizer, actor.optim, 10 * self.steps)
        self.settings = StepSettings(actor=actor, max_response_length=MAX_RESPONSE, norm_adv_by_std_in_grpo=True,
                                     temperature=1.0, packed=True, device=cpu, seed=0)

    async def group(self, index: int) -> list[Trajectory]:
        prompt = tuple(random.Random(10_000 + index).randrange(VOCAB) for _ in range(PROMPT))

        async def sample(i: int, length: int) -> Trajectory:
            out = await self.engine.generate(prompt, SamplingParams(max_new_tokens=length, seed=index * 100 + i),
                                             f"g{index}-{i}")
            return Trajectory(trajectory_id=f"g{index}-{i}", group_id=f"g{index}", prompt_ids=prompt,
                              response_ids=out.token_ids, response_mask=(1,) * len(out.token_ids),
                              rollout_logprobs=out.logprobs, reward=float((index + i) % 2),
                              policy_version=out.policy_version)

        return list(await asyncio.gather(*(sample(i, k) for i, k in enumerate(lengths_for(index, self.n)))))

    async def learn(self, batch: list[Trajectory], step: int) -> None:
        """One GRPO step, then weight sync: write the adapter, the engine loads it."""
        self.trained_lengths.extend(len(t.response_ids) for t in batch)
        self.trained_by_step.append(sum(len(t.response_ids) for t in batch))
        started = time.perf_counter()
        await asyncio.to_thread(train_step, self.model, self.optimizer, self.scheduler, batch, step, self.settings)
        path = await asyncio.to_thread(save_adapter, self.model, gather_adapter(self.model), self.adapter_dir / f"v{step}")
        self.train_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        await self.engine.load_adapter(AdapterRef(version=step, path=str(path)))
        self.sync_s.append(time.perf_counter() - started)

    async def sync(self) -> list[float]:
        times, cursor = [], 0
        for step in range(1, self.steps + 1):
            started = time.perf_counter()
            self.settled_groups.extend(range(cursor, cursor + self.groups))
            self.started_groups = cursor + self.groups
            groups = await asyncio.gather(*(self.group(cursor + g) for g in range(self.groups)))
            cursor += self.groups
            await self.learn([t for g in groups for t in g], step)
            times.append(time.perf_counter() - started)
            self.wait_s.append(times[-1] - self.train_s[-1] - self.sync_s[-1])
        return times

    async def stream(self, max_staleness: int, abort_stale: bool, *, fixed_set: bool = False) -> list[float]:
        """As ``orchestration.coordinator``: admit tickets, start groups, sleep until a publish, a group's end or a drop.
        ``fixed_set``: the data are the ``steps x groups`` groups the sync run trains and no more, so the last steps
        wait for that set's slowest groups, as sync does at every step."""
        total = self.steps * self.groups if fixed_set else None
        admission = AdmissionController(self.groups, max_staleness, abort_stale=abort_stale)
        buffer = TrajectoryBuffer(self.groups, capacity_groups=4 * self.groups, max_staleness=max_staleness,
                                  drop_stale=abort_stale)
        wake = asyncio.Event()
        tasks: dict[int, tuple[asyncio.Task, str]] = {}  # ticket id -> (task, group id)

        def dropped(count: int) -> None:
            admission.dropped(count)
            wake.set()

        buffer.set_drop_listener(dropped)

        async def produce(ticket_id: int, index: int) -> None:
            try:
                group = await self.group(index)
                self.settled_groups.append(index)
                await buffer.put_group(group)
                admission.finished(ticket_id)
            finally:
                tasks.pop(ticket_id, None)
                wake.set()

        async def coordinator() -> None:
            cursor = 0
            while not buffer.closed:
                wake.clear()
                tickets = admission.admit(64 if total is None else total - cursor)
                for ticket in tickets:
                    tasks[ticket.id] = (asyncio.create_task(produce(ticket.id, cursor)), f"g{cursor}")
                    cursor += 1
                self.started_groups = cursor
                if not tickets:
                    await wake.wait()

        coord = asyncio.create_task(coordinator())
        times = []
        for step in range(1, self.steps + 1):
            started = time.perf_counter()
            batch = await buffer.next_batch(step)
            self.wait_s.append((await buffer.pop_step_metrics(step))["timing/wait_batch_s"])
            await self.learn(batch, step)
            doomed = admission.on_publish(step)  # the publish push
            if doomed:
                await buffer.discard([tasks[t.id][1] for t in doomed if t.id in tasks])
                for ticket in doomed:
                    if ticket.id in tasks:
                        tasks[ticket.id][0].cancel()
                        self.settled_groups.append(int(tasks[ticket.id][1][1:]))
            wake.set()
            times.append(time.perf_counter() - started)
        stats, adm = await buffer.stats(), admission.stats()
        self.accounting = (f"groups admitted={int(adm['groups/admitted'])}, trained={int(stats['groups/trained'])}, "
                           f"aborted={int(adm['groups/aborted_in_flight'])}, "
                           f"dropped={int(stats['groups/dropped_stale'])}, "
                           f"left over={int(stats['buffer/depth'] + adm['groups/in_flight'])}")
        await buffer.close()
        coord.cancel()
        for task, _ in list(tasks.values()):
            task.cancel()
        return times

    def long_shares(self) -> tuple[float, float, float, float]:
        """(threshold, trained long share, generated long share, started long share). Generated: over the groups
        whose generation ended (finished, aborted or dropped; not those still running when the mode stopped), the
        threshold the 90th percentile of their samples' lengths. Started: over every group started, at the lengths
        drawn for it; the groups still running at the end are more often long ones (short groups finish first)."""
        generated = [k for g in set(self.settled_groups) for k in lengths_for(g, self.n)]
        threshold = long_threshold(generated)
        started = [k for g in range(self.started_groups) for k in lengths_for(g, self.n)]
        return (threshold, long_share(self.trained_lengths, threshold), long_share(generated, threshold),
                long_share(started, threshold))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                             tie_word_embeddings=True)
        Qwen2ForCausalLM(config).save_pretrained(model_dir)
        results, shares, walls = {}, {}, {}
        for mode, swap in MODES.items():
            engine = EngineProcess(model_dir, max_model_len=PROMPT + MAX_RESPONSE + 8, max_batch_size=64,
                                   eos_token_ids=[], swap=swap)
            run = Run(engine, model_dir, Path(tmp) / mode, args)
            times = asyncio.run(run.sync() if mode == "sync" else
                                run.stream(args.max_staleness, mode == "stream-abort", fixed_set=mode == "stream-fixed"))
            engine_stats = asyncio.run(engine.stats())
            engine.close()
            results[mode] = sum(run.trained_by_step[1:]) / sum(times[1:])  # the first step includes warm-up
            walls[mode] = sum(times)
            threshold, trained_long, generated_long, started_long = run.long_shares()
            shares[mode] = (trained_long, generated_long)
            print(f"{mode:>12}: step times {[round(t, 2) for t in times]}  trained tokens/s (steps 2..) "
                  f"{results[mode]:.0f}\n"
                  f"{'':>14}waiting for rollouts {statistics.mean(run.wait_s[1:]):.2f}s, training "
                  f"{statistics.mean(run.train_s[1:]):.2f}s, weight sync {statistics.mean(run.sync_s[1:]):.2f}s; "
                  f"trained response length mean {statistics.mean(run.trained_lengths):.0f}; "
                  f"long share (> {threshold} tokens) trained {100 * trained_long:.1f}% vs generated "
                  f"{100 * generated_long:.1f}% (of the groups started: {100 * started_long:.1f}%)\n"
                  f"{'':>14}{run.accounting}; engine: {engine_stats['generated_tokens']} tokens generated, "
                  f"{engine_stats['decode_rows'] / max(engine_stats['steps'], 1):.1f} rows per decode step, "
                  f"{engine_stats['recomputed_tokens']} tokens recomputed after weight syncs; engine seconds: decode "
                  f"{engine_stats['decode_s']:.1f}, prefill {engine_stats['prefill_s']:.1f}, recompute "
                  f"{engine_stats['recompute_s']:.1f} of {walls[mode]:.1f} s wall")
    print(f"{args.groups} groups x {args.n} samples per step, max_staleness {args.max_staleness}, response lengths "
          f"85% 16-48 / 15% {MAX_RESPONSE // 2}-{MAX_RESPONSE} tokens")
    for mode in ("stream-drain", "stream-abort"):
        print(f"{mode}/sync trained tokens/s: {results[mode] / results['sync']:.2f}x "
              f"(long share trained {100 * shares[mode][0]:.1f}% vs generated {100 * shares[mode][1]:.1f}%)")
    fixed = args.steps * args.groups
    print(f"a fixed set of {fixed} groups, every one trained (the same groups and tokens): sync {walls['sync']:.1f} s, "
          f"stream {walls['stream-fixed']:.1f} s: stream/sync {walls['sync'] / walls['stream-fixed']:.2f}x "
          "(wall time, the first step's warm-up included in both)")
    ratio = results["stream"] / results["sync"]
    trained_long, generated_long = shares["stream"]
    ok = ratio >= GOAL_RATIO and abs(trained_long - generated_long) * 100 <= LONG_SHARE_POINTS
    print(f"stream/sync trained tokens/s: {ratio:.2f}x (long share trained {100 * trained_long:.0f}% vs generated "
          f"{100 * generated_long:.0f}%) {'PASS' if ok else 'FAIL'}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
