"""Model and adapter folders for the engine tests and checks (test helper, not collected).

Shared by the HFEngine and VLLMEngine tests: everything here needs only torch, transformers and peft.
"""

from __future__ import annotations

from pathlib import Path

import torch


def build_model(out_dir: str | Path, seed: int = 0) -> Path:
    """The project's tiny Qwen2 model (tokenizer + chat template + random weights)."""
    from apps.make_tiny_model import build_tiny_model

    return build_tiny_model(out_dir, seed=seed)


def build_random_adapter(model_path: str | Path, out_dir: str | Path, seed: int, rank: int = 8) -> Path:
    """A peft LoRA adapter on every attention and MLP projection with large random B weights.

    peft initialises B to zero (the adapter starts as the identity); random B with std 1 makes the
    adapter move the logits far enough that greedy outputs change.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        lora_dropout=0.0,
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    out = Path(out_dir)
    model.save_pretrained(out)
    return out
