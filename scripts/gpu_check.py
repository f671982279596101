"""The prepared GPU check: one GRPO step of our trainer code under FSDP2 + LoRA, and HFEngine generation, on one
device, without Ray. Prints step time, tokens/s and MFU, and a verdict computed from what it measured.

    python scripts/gpu_check.py --device cuda            # on a GPU machine (see scripts/gpu_check.sh)
    python scripts/gpu_check.py --device cpu --shape tiny --groups 2 --n 2 --prompt-len 16 --response-len 16

What runs is the training worker's own code (``trainers.model.build_policy``: peft LoRA, FSDP2 ``fully_shard``
with bf16 mixed precision on CUDA; ``trainers.optim``; ``trainers.step.train_step``: GRPO advantages, old
log-prob recompute, verl's policy loss, backward, clip, step) on a one-rank process group (nccl on CUDA, gloo
on CPU), and ``deployments.engines.hf_engine.HFEngine`` on the same device. The model has Qwen2.5-0.5B's shape
with random weights (no hub here); ``--shape tiny`` is a 4-layer model for CPU tests.

A machine without Ray (the lent GPU machine has torch, transformers and peft, and Ray's wheel is too large to
carry there) still runs it: verl imports ``ray`` at module level for its single-controller classes, which this
check never uses, so when ``import ray`` fails a stand-in module is registered that raises on any use.

Verdict (PASS/FAIL), computed: every step's loss and grad norm finite, the grad norm above zero, the LoRA
weights changed by the steps, and the engine produced every token asked for.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file from the repository root, installed or not
    sys.path.insert(0, str(ROOT))

# Dense bf16 peak of the chips this check expects, TFLOP/s (vendor figures); --peak-tflops overrides.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}

SHAPES = {
    # Qwen2.5-0.5B's config (hidden 896, 24 layers, 14 heads / 2 KV heads, vocab 151936, tied embeddings)
    "qwen2.5-0.5b": {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                     "rope_theta": 1000000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-6},
    "tiny": {"vocab_size": 2000, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
             "tie_word_embeddings": True},
}


class _RayAbsent(types.ModuleType):
    """Stands in for ``ray`` where it is not installed: importable, every use raises."""

    ObjectRef = type("ObjectRef", (), {})  # verl.protocol annotates a dataclass field with it at import time

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"ray.{name}: Ray is not installed on this machine; the GPU check does not use Ray")


def ray_or_stand_in() -> bool:
    """True when the real Ray is importable; else registers the stand-in and returns False."""
    try:
        import ray  # noqa: F401
        return True
    except ImportError:
        sys.modules["ray"] = _RayAbsent("ray")
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per step")
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--token-budget", type=int, default=16384, help="tokens per micro-batch (dynamic bsz)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="measured steps, after one warm-up step")
    parser.add_argument("--requests", type=int, default=16, help="concurrent generate requests")
    parser.add_argument("--gen-tokens", type=int, default=128, help="new tokens per generate request")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak for MFU (default: known for H200/H100/A100; none on CPU)")
    args = parser.parse_args(argv)
    for key in ("groups", "n", "prompt_len", "response_len", "token_budget", "steps", "requests", "gen_tokens"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.n < 2:
        parser.error("--n must be >= 2 (GRPO advantages compare samples of one group)")
    if args.prompt_len + args.response_len > args.token_budget:
        parser.error(f"--token-budget {args.token_budget} is below one sequence "
                     f"({args.prompt_len} + {args.response_len} tokens)")
    return args


def make_model(shape: str, folder: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape])).save_pretrained(folder)
    return folder


def make_batch(groups: int, n: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    """Random token episodes with 0/1 rewards mixed within each group (so every group has an advantage)."""
    from agents.records import Trajectory

    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = tuple(rng.randrange(vocab) for _ in range(prompt_len))
        for i in range(n):
            out.append(Trajectory(
                trajectory_id=f"g{g}-{i}", group_id=f"g{g}", prompt_ids=prompt,
                response_ids=tuple(rng.randrange(vocab) for _ in range(response_len)),
                response_mask=(1,) * response_len, rollout_logprobs=(-math.log(vocab),) * response_len,
                reward=float(i % 2), policy_version=0,
            ))
    return out


def matmul_params(model) -> int:
    """Weights of every linear layer of the base model, the LM head included (tied or not): the N of 6·N."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return sum(m.weight.numel() for name, m in base.named_modules()
               if isinstance(m, torch.nn.Linear) and "lora_" not in name)


def train_check(args, model_dir: Path, device, tmp: str) -> dict:
    import torch
    import torch.distributed as dist

    from configs import load_config
    from trainers.model import build_policy, gather_adapter
    from trainers.optim import build_optimizer, make_scheduler
    from trainers.step import StepSettings, train_step

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"file://{tmp}/pg", rank=0, world_size=1)
    try:
        batch_groups = args.groups
        cfg = load_config(None, [
            f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.model.lora_rank={args.lora_rank}",
            f"actor_rollout_ref.model.lora_alpha={2 * args.lora_rank}",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.token_budget}",
            f"data.train_batch_size={batch_groups}", f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_groups}",
            f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.response_len}",
            f"trainer.device={device.type}",
        ])
        actor = cfg.actor_rollout_ref.actor
        model = build_policy(cfg.actor_rollout_ref.model, actor.fsdp_config, device, seed=0)
        n_matmul = matmul_params(model)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        optimizer = build_optimizer(model, actor.optim)
        scheduler = make_scheduler(optimizer, actor.optim, args.steps + 1)
        settings = StepSettings(actor=actor, max_response_length=args.response_len, norm_adv_by_std_in_grpo=True,
                                temperature=1.0, packed=cfg.actor_rollout_ref.model.use_remove_padding,
                                device=device, seed=0)
        vocab = SHAPES[args.shape]["vocab_size"]
        before = {k: v.clone() for k, v in gather_adapter(model).items()}
        steps = []
        for k in range(args.steps + 1):  # step 0 is the warm-up
            batch = make_batch(args.groups, args.n, args.prompt_len, args.response_len, vocab, seed=k)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            metrics = train_step(model, optimizer, scheduler, batch, k + 1, settings)
            if device.type == "cuda":
                torch.cuda.synchronize()
            metrics["wall_s"] = time.perf_counter() - start
            steps.append(metrics)
        after = gather_adapter(model)
        changed = sum(1 for k, v in before.items() if not torch.equal(v, after[k]))
        peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    finally:
        dist.destroy_process_group()
    tokens = args.groups * args.n * (args.prompt_len + args.response_len)
    return {"steps": steps, "tokens": tokens, "n_matmul": n_matmul, "trainable": trainable,
            "lora_tensors": len(before), "lora_changed": changed, "peak_mem_gib": peak_mem}


def engine_check(args, model_dir: Path, device) -> dict:
    import torch

    from agents.records import SamplingParams
    from deployments.engines.hf_engine import HFEngine

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    engine = HFEngine(str(model_dir), max_model_len=args.prompt_len + args.gen_tokens + 8, dtype=dtype,
                      device=str(device), max_batch_size=args.requests, eos_token_ids=())
    vocab = SHAPES[args.shape]["vocab_size"]
    rng = random.Random(1)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.gen_tokens, seed=0)

    async def run() -> dict:
        try:
            await engine.generate(prompts[0], SamplingParams(max_new_tokens=4), "warmup")
            start = time.perf_counter()
            one = await engine.generate(prompts[0], sampling, "one")
            one_s = time.perf_counter() - start
            start = time.perf_counter()
            many = await asyncio.gather(*[engine.generate(p, sampling, f"c{i}") for i, p in enumerate(prompts)])
            many_s = time.perf_counter() - start
        finally:
            await engine.close()
        return {"one": len(one.token_ids) / one_s, "many": sum(len(o.token_ids) for o in many) / many_s,
                "complete": len(one.token_ids) == args.gen_tokens
                and all(len(o.token_ids) == args.gen_tokens for o in many),
                "dtype": dtype}

    out = asyncio.run(run())
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def peak_tflops(args, device) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    if device.type != "cuda":
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    has_ray = ray_or_stand_in()
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
            return 2
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
        where = f"cuda ({torch.cuda.get_device_name(device)}), nccl, bf16 mixed precision"
    else:
        device = torch.device("cpu")
        where = "cpu, gloo, fp32"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    print(f"gpu_check: {where}, world size 1; torch {torch.__version__}, transformers {transformers.__version__}; "
          f"Ray {'installed (unused)' if has_ray else 'absent: stand-in module registered for verl imports'}")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model_dir = make_model(args.shape, Path(tmp) / "model")
        print(f"model: {args.shape} shape, random weights, written in {time.perf_counter() - start:.1f} s")
        train = train_check(args, model_dir, device, tmp)
        gen = engine_check(args, model_dir, device)
    measured = train["steps"][1:]
    wall = statistics.median(m["wall_s"] for m in measured)
    tokens_per_s = train["tokens"] / wall
    flops = 6 * train["n_matmul"] * train["tokens"]  # PaLM's convention, see the MFU line
    peak = peak_tflops(args, device)
    mfu = f"{flops / wall / (peak * 1e12):.1%} of {peak:.0f} TFLOP/s" if peak else "n/a (no peak for this device)"
    print(f"policy: {train['n_matmul'] / 1e6:.1f}M matmul weights, LoRA r{args.lora_rank}: "
          f"{train['trainable'] / 1e6:.2f}M trainable in {train['lora_tensors']} tensors; FSDP2 fully_shard per layer")
    print(f"batch: {args.groups} groups x {args.n} samples, prompt {args.prompt_len} + response {args.response_len} "
          f"tokens = {train['tokens']} tokens per step, {args.token_budget}-token micro-batches")
    for i, m in enumerate(train["steps"]):
        label = "warm-up" if i == 0 else f"step {i}"
        print(f"  {label:8s} {m['wall_s']:7.2f} s  pg_loss {m['pg_loss']:+.4f}  grad_norm {m['grad_norm']:.4f}  "
              f"updates {m['num_updates']:.0f}")
    print(f"train step: median {wall:.2f} s over {len(measured)} steps, {tokens_per_s:,.0f} tokens/s, MFU {mfu} "
          f"(6·N·tokens: counts weight gradients LoRA skips, not the old-log-prob forward or attention)"
          + (f"; peak memory {train['peak_mem_gib']:.1f} GiB" if device.type == "cuda" else ""))
    print(f"HFEngine ({gen['dtype']}): 1 request {gen['one']:,.1f} tokens/s; {args.requests} concurrent "
          f"{gen['many']:,.1f} tokens/s ({args.gen_tokens} new tokens each)")
    failures = []
    if not all(math.isfinite(m["pg_loss"]) and math.isfinite(m["grad_norm"]) for m in train["steps"]):
        failures.append("a non-finite loss or grad norm")
    if not all(m["grad_norm"] > 0 for m in train["steps"]):
        failures.append("a zero grad norm")
    if train["lora_changed"] == 0:
        failures.append("the LoRA weights did not change")
    if not gen["complete"]:
        failures.append("the engine returned fewer tokens than asked")
    verdict = "PASS" if not failures else "FAIL (" + "; ".join(failures) + ")"
    print(f"gpu_check: train {tokens_per_s:,.0f} tokens/s, MFU {mfu.split(' of ')[0]}, LoRA tensors changed "
          f"{train['lora_changed']}/{train['lora_tensors']}, engine {gen['many']:,.0f} tokens/s at {args.requests} "
          f"concurrent {verdict}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
