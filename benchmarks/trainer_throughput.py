"""Trainer throughput: fixed vs token-budget (dynamic) micro-batches, padded vs packed, on a long-tailed
response-length mix, measured side by side in one run.

Runs the real GRPO step (``trainers.step.train_step``: recompute old log-probs + one PPO epoch) on ONE
in-process rank (gloo, world size 1, FSDP2 over one rank), without Ray, on a random tiny Qwen2 — so it
measures micro-batching and padding, not distributed overhead. tokens/s = real prompt+response tokens of
the step batch / step wall time; padding fraction = padded slots / all slots fed to the model.

    python -m benchmarks.trainer_throughput [--groups 6] [--n 4] [--steps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from agents.records import Trajectory
from configs import load_config
from trainers.batching import collate, filler, plan_step, samples_from_trajectories
from trainers.model import build_policy
from trainers.step import StepSettings, train_step
from trainers.optim import build_optimizer, make_scheduler

VOCAB = 2000
MAX_RESPONSE = 512
MAX_PROMPT = 96
BUDGET = 2048  # tokens per micro-batch (dynamic)
# The largest fixed micro-batch whose worst case (every row prompt + response at the maximum) fits the same
# budget: what a verl user must pick for fixed micro-batches to be safe on memory.
FIXED = BUDGET // (MAX_PROMPT + MAX_RESPONSE)


def long_tailed_batch(groups: int, n: int, seed: int) -> list[Trajectory]:
    """85% short responses (16–64 tokens), 15% long ones (256–512): agent episodes that hit tool loops."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(32, MAX_PROMPT)))
        for i in range(n):
            length = rng.randint(256, MAX_RESPONSE) if rng.random() < 0.15 else rng.randint(16, 64)
            out.append(Trajectory(
                trajectory_id=f"g{g}-{i}", group_id=f"g{g}", prompt_ids=prompt,
                response_ids=tuple(rng.randrange(VOCAB) for _ in range(length)), response_mask=(1,) * length,
                rollout_logprobs=(-7.6,) * length, reward=float(rng.random() < 0.5), policy_version=0,
            ))
    return out


def padding_fraction(cfg, trajectories: list[Trajectory]) -> float:
    actor = cfg.actor_rollout_ref.actor
    samples = samples_from_trajectories(trajectories, [0.0] * len(trajectories), MAX_RESPONSE)
    plans = plan_step(samples, rank=0, world_size=1, groups_per_mini_batch=actor.ppo_mini_batch_size,
                      use_dynamic_bsz=actor.use_dynamic_bsz, micro_batch_size=actor.micro_batch_size,
                      max_token_len=actor.ppo_max_token_len_per_gpu,
                      packed=cfg.actor_rollout_ref.model.use_remove_padding)
    real = slots = 0
    for plan in plans:
        for idx in plan.micro_batches:
            mb = collate([samples[i] for i in idx] or [filler(samples[plan.filler_index])],
                         cfg.actor_rollout_ref.model.use_remove_padding)
            real, slots = real + mb.num_tokens, slots + mb.padded_tokens
    return 1.0 - real / slots


def _runner(model_dir: Path, trajectories, dynamic: bool, packed: bool, n_groups: int, steps: int):
    cfg = load_config(None, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.lora_rank=8",
        f"actor_rollout_ref.model.use_remove_padding={str(packed).lower()}",
        f"actor_rollout_ref.actor.use_dynamic_bsz={str(dynamic).lower()}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={FIXED}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={BUDGET}",
        f"data.train_batch_size={n_groups}", f"actor_rollout_ref.actor.ppo_mini_batch_size={n_groups}",
        f"data.max_response_length={MAX_RESPONSE}",
    ])
    actor, cpu = cfg.actor_rollout_ref.actor, torch.device("cpu")
    model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, cpu, seed=0)
    optimizer = build_optimizer(model, actor.optim)
    scheduler = make_scheduler(optimizer, actor.optim, steps + 1)
    settings = StepSettings(actor=actor, max_response_length=MAX_RESPONSE, norm_adv_by_std_in_grpo=True,
                            temperature=1.0, packed=packed, device=cpu, seed=0)

    def step(k: int) -> tuple[float, float]:
        wall, cpu_s = time.perf_counter(), time.process_time()
        train_step(model, optimizer, scheduler, trajectories, k, settings)
        return time.perf_counter() - wall, time.process_time() - cpu_s

    return cfg, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a shared 2-core box: one thread per run keeps the comparison fair
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        torch.manual_seed(0)
        Qwen2ForCausalLM(Qwen2Config(
            vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024,
        )).save_pretrained(model_dir)
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        trajectories = long_tailed_batch(args.groups, args.n, seed=0)
        tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in trajectories)
        lengths = sorted(len(t.response_ids) for t in trajectories)
        print(f"batch: {len(trajectories)} trajectories, {tokens} tokens, response length p50="
              f"{lengths[len(lengths) // 2]} max={lengths[-1]}; fixed = {FIXED} per micro-batch (worst case fits the "
              f"budget), dynamic = {BUDGET}-token budget; 1 rank in-process (no Ray), 1 thread; median of "
              f"{args.steps} steps, configs interleaved")
        names = [f"{'dynamic' if d else 'fixed'}+{'packed' if p else 'padded'}"
                 for d in (False, True) for p in (False, True)]
        runners = {}
        for name in names:
            runners[name] = _runner(model_dir, trajectories, name.startswith("dynamic"), name.endswith("packed"),
                                    args.groups, args.steps)
            runners[name][1](0)  # warm-up
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for k in range(1, args.steps + 1):
            for name in names:  # interleaved, so load from other processes hits every config alike
                times[name].append(runners[name][1](k))
        dist.destroy_process_group()
    rows = {}
    for name in names:
        wall = statistics.median(t[0] for t in times[name])
        cpu_s = statistics.median(t[1] for t in times[name])
        rows[name] = (tokens / wall, tokens / cpu_s)
        print(f"{name:15s} tokens/s={tokens / wall:7.0f}  tokens/cpu-s={tokens / cpu_s:7.0f}  "
              f"padding={padding_fraction(runners[name][0], trajectories):6.1%}")
    base_wall, base_cpu = rows["fixed+padded"]
    print("vs fixed+padded, tokens/s: " + ", ".join(f"{k} {v[0] / base_wall:.2f}x" for k, v in rows.items()))
    print("vs fixed+padded, tokens/cpu-s: " + ", ".join(f"{k} {v[1] / base_cpu:.2f}x" for k, v in rows.items()))
    best = rows["dynamic+packed"]
    print(f"dynamic+packed vs fixed+padded: tokens/cpu-s {best[1] / base_cpu:.2f}x, tokens/s {best[0] / base_wall:.2f}x, "
          f"padding {padding_fraction(runners['fixed+padded'][0], trajectories):.0%} → "
          f"{padding_fraction(runners['dynamic+packed'][0], trajectories):.0%}")


if __name__ == "__main__":
    main()
