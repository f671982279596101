"""HFEngine step-level batching, measured: 16 concurrent requests vs the same 16 one at a time.

    python -m benchmarks.engine_batching [--requests 16] [--max-new-tokens 64] [--rounds 2] [--threads 1]
                                         [--no-transformers-cb]

Builds the tiny model, then in one run prints generated tokens/s of (1) the 16 requests sent one at a
time, (2) the same 16 requests sent concurrently (the two alternate for ``--rounds`` rounds) (served in shared decode steps), their ratio (goal
>= 4x), and (3) for reference transformers' own continuous batching (``generate_batch``) on the same
prompts, the alternative HFEngine was measured against. EOS is disabled so every request generates
exactly ``--max-new-tokens`` tokens in every mode.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import torch

from agents.records import SamplingParams
from apps.make_tiny_model import build_tiny_model
from deployments.engines.hf_engine import HFEngine

GOAL = "HFEngine tokens/s, 16 concurrent requests vs one at a time >= 4x"
GOAL_RATIO = 4.0


def make_prompts(n: int, vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab_size, (16 + 4 * (i % 5),), generator=generator).tolist() for i in range(n)]


async def engine_tokens_per_s(
    engine: HFEngine, prompts: list[list[int]], sampling: SamplingParams, rounds: int
) -> dict[str, float]:
    """Alternate one-at-a-time and concurrent rounds so both see the same machine load."""
    tokens = {"sequential": 0, "concurrent": 0}
    seconds = {"sequential": 0.0, "concurrent": 0.0}
    steps_before = engine.stats["steps"]
    concurrent_steps = 0
    for r in range(rounds):
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            tokens["sequential"] += len((await engine.generate(prompt, sampling, f"seq-{r}-{i}")).token_ids)
        seconds["sequential"] += time.perf_counter() - start
        steps_before = engine.stats["steps"]
        start = time.perf_counter()
        outs = await asyncio.gather(*[engine.generate(p, sampling, f"conc-{r}-{i}") for i, p in enumerate(prompts)])
        seconds["concurrent"] += time.perf_counter() - start
        tokens["concurrent"] += sum(len(o.token_ids) for o in outs)
        concurrent_steps += engine.stats["steps"] - steps_before
    return {
        "sequential": tokens["sequential"] / seconds["sequential"],
        "concurrent": tokens["concurrent"] / seconds["concurrent"],
        "concurrent_steps": concurrent_steps / rounds,
        "max_batch_size": engine.stats["max_batch_size"],
    }


def transformers_cb_tokens_per_s(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> float:
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_k=0, eos_token_id=-1)
    cb_config = ContinuousBatchingConfig(return_logprobs=True, per_request_processors=True, num_blocks=64, block_size=32)
    start = time.perf_counter()
    outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb_config,
                                progress_bar=False, warmup=False)
    return sum(len(o.generated_tokens) for o in outs.values()) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternating one-at-a-time / concurrent rounds")
    # One intra-op thread, as a Serve replica with num_cpus=1 gets (Ray sets OMP_NUM_THREADS from num_cpus).
    # With 2 threads on a busy 2-core box, batched matmuls wait on descheduled threads and swamp the result.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-transformers-cb", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    with tempfile.TemporaryDirectory() as work:
        model_dir = str(build_tiny_model(work, seed=0))
        engine = HFEngine(model_dir, max_model_len=512, max_batch_size=args.requests, eos_token_ids=())
        prompts = make_prompts(args.requests, engine._model.config.vocab_size)

        async def measure() -> dict:
            await engine.generate(prompts[0], SamplingParams(max_new_tokens=4), "warmup")
            try:
                return await engine_tokens_per_s(engine, prompts, sampling, args.rounds)
            finally:
                await engine.close()

        result = asyncio.run(measure())
        print(f"HFEngine, tiny model, {args.requests} requests x {args.max_new_tokens} new tokens, "
              f"torch threads {torch.get_num_threads()}")
        print(f"one at a time:          {result['sequential']:8.1f} tokens/s")
        print(f"{args.requests} concurrent:          {result['concurrent']:8.1f} tokens/s "
              f"({result['concurrent_steps']:.0f} decode steps per round, max batch {result['max_batch_size']})")
        if not args.no_transformers_cb:
            cb = transformers_cb_tokens_per_s(model_dir, prompts, args.max_new_tokens)
            print(f"transformers generate_batch (continuous batching, CPU), same prompts: {cb:8.1f} tokens/s")
        ratio = result["concurrent"] / result["sequential"]
        print(f"ratio concurrent/one-at-a-time: {ratio:.2f}x {'PASS' if ratio >= GOAL_RATIO else 'FAIL'}")


if __name__ == "__main__":
    main()
