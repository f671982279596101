"""Engine interface behind ``RolloutServer`` (deployments layer).

An engine turns prompt token ids into sampled token ids plus their log-probs, and can swap the
LoRA adapter it samples with. ``HFEngine`` (transformers, CPU default) and ``VLLMEngine`` (GPU)
implement it; ``RolloutServer`` receives one by injection, so tests use the real CPU engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from agents.records import AdapterRef, FinishReason, SamplingParams


@dataclass(frozen=True)
class EngineOutput:
    """What one ``generate`` returns: the sampled ids and their log-probs, why sampling stopped, and the adapter
    versions that sampled them."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    # the adapter version that sampled every token of this output (0 = base model); the oldest one when
    # an interrupting swap (partial rollout) happened mid-generation
    policy_version: int = 0
    # the adapter version that sampled each token, when the engine records it (HFEngine does)
    token_versions: tuple[int, ...] = ()


class PromptTooLong(ValueError):
    """A prompt does not fit the engine's ``max_model_len``; never truncated silently."""


class Engine(Protocol):
    """What ``RolloutServer`` needs from an engine: batched token-in/token-out sampling and LoRA adapter swaps."""

    max_model_len: int

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str
    ) -> EngineOutput:
        """Sample up to ``sampling.max_new_tokens`` tokens; concurrent calls are batched."""

    async def load_adapter(self, ref: AdapterRef) -> None:
        """Sample with this adapter from now on (version 0 = base model)."""

    async def close(self) -> None:
        """Release the engine's resources."""
