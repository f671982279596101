"""Fixtures of the engine tests: LoRA adapters for the shared tiny model, and the model as transformers loads it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.deployments.engines.tiny_assets import build_random_adapter


@pytest.fixture(scope="session")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Two different random LoRA adapters (policy versions 1 and 2) for the tiny model."""
    root = tmp_path_factory.mktemp("adapters")
    return {v: build_random_adapter(tiny_model_dir, root / f"v{v}", seed=v) for v in (1, 2)}


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> AutoModelForCausalLM:
    """The tiny model loaded by transformers alone: what the engines' outputs are compared with."""
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
