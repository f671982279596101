"""Streaming vs batch-synchronous GRPO: wall time per training step on a long-tailed response-length mix,
both measured in one run.

Real parts: ``HFEngine`` generation (step-level batching) on a random tiny Qwen2, the ``TrajectoryBuffer``
(admission bounded by ``max_staleness``, first complete groups win), and the real GRPO step
(``trainers.step.train_step``, FSDP2 over one in-process gloo rank), all in one process without Ray so
that only the scheduling differs between the two modes. Response lengths are drawn per sample from a
long-tailed mix (85% 16-48 tokens, 15% 512-1024: agent episodes that hit tool loops) and forced by ``max_new_tokens``
with EOS disabled; both modes see the same sequence of groups and lengths. New adapters are not loaded
into the engine here (the sampled tokens are the same either way; weight sync is measured by the driver).

- sync: generate every group of the batch (the slowest decides), then train; no generation while training.
- stream: keep generating within ``--max-staleness`` (default 2); the learner takes the first complete groups.

    python -m benchmarks.stream_vs_sync [--steps 6] [--groups 4] [--n 4]
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

from agents.records import SamplingParams, Trajectory
from configs import load_config
from deployments.engines.hf_engine import HFEngine
from trainers.buffer import TrajectoryBuffer
from trainers.model import build_policy
from trainers.step import StepSettings, train_step
from trainers.worker import build_optimizer, make_scheduler

VOCAB, PROMPT, MAX_RESPONSE = 1000, 48, 1024


def lengths_for(group: int, n: int) -> list[int]:
    rng = random.Random(group)
    return [rng.randint(MAX_RESPONSE // 2, MAX_RESPONSE) if rng.random() < 0.15 else rng.randint(16, 48) for _ in range(n)]


class Run:
    def __init__(self, model_dir: Path, groups: int, n: int, steps: int):
        self.groups, self.n, self.steps = groups, n, steps
        self.engine = HFEngine(str(model_dir), max_model_len=PROMPT + MAX_RESPONSE + 8, max_batch_size=64,
                               eos_token_ids=[])
        cfg = load_config(None, [
            f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
            f"data.train_batch_size={groups}", f"actor_rollout_ref.actor.ppo_mini_batch_size={groups}",
            f"data.max_response_length={MAX_RESPONSE}", f"actor_rollout_ref.rollout.n={n}",
        ])
        actor, cpu = cfg.actor_rollout_ref.actor, torch.device("cpu")
        self.model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, cpu, seed=0)
        self.optimizer = build_optimizer(self.model, actor.optim)
        self.scheduler = make_scheduler(self.optimizer, actor.optim, 10 * steps)
        self.settings = StepSettings(actor=actor, max_response_length=MAX_RESPONSE, norm_adv_by_std_in_grpo=True,
                                     temperature=1.0, packed=True, device=cpu, seed=0)

    async def group(self, index: int, version: int) -> list[Trajectory]:
        prompt = tuple(random.Random(10_000 + index).randrange(VOCAB) for _ in range(PROMPT))

        async def sample(i: int, length: int) -> Trajectory:
            out = await self.engine.generate(prompt, SamplingParams(max_new_tokens=length, seed=index * 100 + i),
                                             f"g{index}-{i}")
            return Trajectory(trajectory_id=f"g{index}-{i}", group_id=f"g{index}", prompt_ids=prompt,
                              response_ids=out.token_ids, response_mask=(1,) * len(out.token_ids),
                              rollout_logprobs=out.logprobs, reward=float((index + i) % 2), policy_version=version)

        return list(await asyncio.gather(*(sample(i, k) for i, k in enumerate(lengths_for(index, self.n)))))

    async def learn(self, batch: list[Trajectory], step: int) -> None:
        await asyncio.to_thread(train_step, self.model, self.optimizer, self.scheduler, batch, step, self.settings)

    async def sync(self) -> list[float]:
        times, cursor = [], 0
        for step in range(1, self.steps + 1):
            started = time.perf_counter()
            groups = await asyncio.gather(*(self.group(cursor + g, step - 1) for g in range(self.groups)))
            cursor += self.groups
            await self.learn([t for g in groups for t in g], step)
            times.append(time.perf_counter() - started)
        return times

    async def stream(self, max_staleness: int = 1) -> list[float]:
        buffer = TrajectoryBuffer(self.groups, max_staleness, capacity_groups=4 * self.groups, streaming=True)
        cursor, tasks = 0, set()

        async def produce(index: int, version: int) -> None:
            await buffer.put_group(await self.group(index, version))

        async def coordinator() -> None:
            nonlocal cursor
            while not buffer.closed:
                for _ in range(await buffer.admit(64)):
                    task = asyncio.create_task(produce(cursor, buffer.version))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    cursor += 1
                await asyncio.sleep(0.01)

        coord = asyncio.create_task(coordinator())
        times = []
        for step in range(1, self.steps + 1):
            started = time.perf_counter()
            batch = await buffer.next_batch(step)
            await self.learn(batch, step)
            await buffer.set_version(step)
            times.append(time.perf_counter() - started)
        await buffer.close()
        coord.cancel()
        for task in list(tasks):
            task.cancel()
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
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
        results = {}
        for mode in ("sync", "stream"):
            run = Run(model_dir, args.groups, args.n, args.steps)
            times = asyncio.run(run.sync() if mode == "sync" else run.stream(args.max_staleness))
            results[mode] = statistics.mean(times[1:])  # the first step includes warm-up in both modes
            print(f"{mode:>7}: step times {[round(t, 2) for t in times]}  mean (steps 2..) {results[mode]:.2f}s")
    print(f"{args.groups} groups x {args.n} samples per step, max_staleness {args.max_staleness}, response lengths 85% 16-48 / 15% {MAX_RESPONSE // 2}-{MAX_RESPONSE} tokens")
    print(f"streaming speedup (sync step time / stream step time): {results['sync'] / results['stream']:.2f}x "
          f"(goal >= 2x)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
