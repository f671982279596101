"""Where one decode step of the HF engine's model forward spends its time, by operator, at the batch sizes
``benchmarks.serve_load`` reaches (its profile lines show the engine busy nearly all the time, mostly decoding).

    python -m benchmarks.decode_step_profile [--rows 8 32 64] [--context 300] [--steps 20] [--threads 2]

SmolLM2-135M-Instruct (as ``make demo`` prepares it) in an ``HFEngine`` (float32, its attention and sampling) and its
cache (``hf_batch.growing_cache``: keys and values appended in place; ``--plain-cache`` uses transformers'
``DynamicCache``, which ``torch.cat``-copies every layer's cache each step, for comparison) and weights packed once
for oneDNN (``hf_linear``; ``--plain-weights``: plain ``nn.Linear``, for comparison): ``--rows`` sequences of
``--context`` tokens are prefilled, then decoded by the engine's own ``_decode`` (its forward and per-row sampling).
Per batch size: the wall time of a step (after warm-up, median of ``--steps``), then one profiled pass of
``--steps`` steps (``torch.profiler``, CPU) grouped by what the operators do: matrix products (the weights),
attention, ``aten::cat`` (the plain cache's growth), copies, the rest; and the share of the step spent outside any
operator (Python, module calls).
No verdict: it explains a figure, it has no goal of its own.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {  # operator name -> group; names not listed fall in "other operators"
    "matrix products": ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul",
                        "mkldnn::_linear_pointwise"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
                  "aten::_scaled_dot_product_attention_math", "aten::softmax", "aten::_softmax"),
    "cat": ("aten::cat",),
    "copies": ("aten::copy_", "aten::clone", "aten::contiguous", "aten::repeat", "aten::index"),
}


def group_of(name: str) -> str:
    return next((group for group, names in GROUPS.items() if name in names), "other operators")


def shares(self_us: dict[str, float], wall_us: float) -> dict[str, float]:
    """Self time by group as shares of the wall time; what no operator accounts for is "outside operators"."""
    grouped: dict[str, float] = {}
    for name, us in self_us.items():
        grouped[group_of(name)] = grouped.get(group_of(name), 0.0) + us
    out = {group: us / wall_us for group, us in sorted(grouped.items(), key=lambda kv: -kv[1])}
    out["outside operators"] = max(0.0, 1.0 - sum(grouped.values()) / wall_us)
    return out


def top_others(self_us: dict[str, float], wall_us: float, count: int = 3) -> str:
    """The largest operators of the "other operators" group, with their shares of the wall time."""
    others = sorted(((us, name) for name, us in self_us.items() if group_of(name) == "other operators"), reverse=True)
    return ", ".join(f"{name} {100 * us / wall_us:.0f}%" for us, name in others[:count])


def profile_rows(engine, rows: int, context: int, steps: int,
                 plain_cache: bool = False) -> tuple[float, dict[str, float], str]:
    """``rows`` prompts of ``context`` tokens prefilled in one forward, then the engine's own decode step
    (``HFEngine._decode``: forward and per-row sampling) timed, then profiled."""
    import torch

    from agents.records import SamplingParams
    from deployments.engines.hf_batch import RequestState, RunningBatch, growing_cache

    ids = torch.randint(1000, 20000, (rows, context))
    budget = 3 + 2 * steps + 1
    requests = [RequestState(f"row-{i}", ids[i].tolist(), SamplingParams(max_new_tokens=budget, seed=i), frozenset(),
                             torch.Generator().manual_seed(i), None) for i in range(rows)]  # no stop token: all decode
    with torch.inference_mode():
        out = engine._model(input_ids=ids, use_cache=True, logits_to_keep=1,  # not [rows, context, vocab] of logits
                            past_key_values=None if plain_cache else growing_cache(engine._model.config))
        batch = RunningBatch(requests, out.past_key_values, torch.ones(rows, context, dtype=torch.long),
                             out.logits[:, -1].argmax(-1))
        del out
        for _ in range(3):
            engine._decode(batch)
        laps = []
        for _ in range(steps):
            started = time.perf_counter()
            engine._decode(batch)
            laps.append(time.perf_counter() - started)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            for _ in range(steps):
                engine._decode(batch)
            wall_us = (time.perf_counter() - started) * 1e6
    self_us = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    del prof, batch
    gc.collect()
    return statistics.median(laps), shares(self_us, wall_us), top_others(self_us, wall_us)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--context", type=int, default=300, help="tokens in the cache when decoding starts")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plain-cache", action="store_true", help="transformers' DynamicCache, not the engine's")
    parser.add_argument("--plain-weights", action="store_true",
                        help="plain nn.Linear, not the weights packed once for oneDNN (HFEngine pack_weights=False)")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2-135m")
    args = parser.parse_args(argv)
    from apps.prepare_model import prepare_model
    from deployments.engines.hf_engine import HFEngine

    path = prepare_model("smollm2-135m", args.model)
    engine = HFEngine(str(path), max_model_len=args.context + 2 * args.steps + 8, num_threads=args.threads,
                      pack_weights=not args.plain_weights)
    for rows in args.rows:
        step_s, by_group, others = profile_rows(engine, rows, args.context, args.steps, args.plain_cache)
        cache = "DynamicCache" if args.plain_cache else "the engine's cache"
        cache += ", plain weights" if args.plain_weights else f", {engine.packed_linears} packed weights"
        print(f"decode_step_profile: {rows} rows, {args.context}+ tokens of context, {cache}, {args.threads} threads: "
              f"{1000 * step_s:.0f} ms/step; " + ", ".join(f"{g} {100 * s:.0f}%" for g, s in by_group.items())
              + f" (largest other operators: {others})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
