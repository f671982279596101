"""Trainer test fixtures: a tiny random Qwen2 (no tokenizer needed), hand-made trajectory groups, and one
local Ray cluster per test session."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents.records import Trajectory

VOCAB = 500


@pytest.fixture(scope="session")
def grpo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen2 with random weights (seed 0), vocab 500, saved as an HF folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("grpo_tiny_qwen2")
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def make_trajectories(num_groups: int, n: int, seed: int, max_response: int = 24) -> list[Trajectory]:
    """Groups of ``n`` with varied lengths, a tool span (mask 0) in some responses, rewards in {0, 0.5, 1}."""
    rng = random.Random(seed)
    out = []
    for g in range(num_groups):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(3, 10)))
        for i in range(n):
            length = rng.randint(2, max_response)
            mask = [1] * length
            if length > 8 and i % 2:
                mask[3:6] = [0, 0, 0]  # a tool result inside the response
            out.append(Trajectory(
                trajectory_id=f"g{g}-{i}", group_id=f"g{g}", prompt_ids=prompt,
                response_ids=tuple(rng.randrange(VOCAB) for _ in range(length)), response_mask=tuple(mask),
                rollout_logprobs=tuple(-6.2 if m else 0.0 for m in mask),
                reward=rng.choice([0.0, 0.5, 1.0]), policy_version=0,
            ))
    return out


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory):
    """The session's shared Ray cluster (tests.ray_head.session_cluster)."""
    import ray

    from tests.ray_head import session_cluster

    with session_cluster(tmp_path_factory.mktemp("session_ray"), Path(__file__).resolve().parents[2]):
        yield ray
