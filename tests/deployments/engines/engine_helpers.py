"""Shared by the HFEngine tests (test helper, not collected): prompts, running an engine, transformers references."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from agents.records import SamplingParams
from deployments.engines.base import EngineOutput
from deployments.engines.hf_engine import HFEngine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
PROMPTS = [[5 + 7 * i + j for j in range(3 + i)] for i in range(6)]  # lengths 3..8, distinct tokens


def run(coro):
    return asyncio.run(coro)


async def generate_all(engine: HFEngine, prompts, sampling: SamplingParams, tag: str) -> list[EngineOutput]:
    return list(await asyncio.gather(*[engine.generate(p, sampling, f"{tag}-{i}") for i, p in enumerate(prompts)]))


async def with_engine(model_dir: Path, body, **kwargs):
    """``body(engine)`` on a fresh HFEngine (``max_model_len`` 256 unless given), closed afterwards."""
    engine = HFEngine(str(model_dir), max_model_len=kwargs.pop("max_model_len", 256), **kwargs)
    try:
        return await body(engine)
    finally:
        await engine.close()


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt) :].tolist()


def hf_logprobs(model, prompt: list[int], generated: tuple[int, ...]) -> list[float]:
    """log_softmax of one forward pass over prompt + generated, at the generated tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(generated)])).logits[0, len(prompt) - 1 : -1]  # [N, V]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(generated)[:, None])[:, 0].tolist()
