"""Starting training from a saved LoRA adapter: ``build_policy`` loads it (trainable) and ``check_adapter``
names what does not fit the base model."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.distributed as dist
from peft import get_peft_model_state_dict
from safetensors.torch import load_file

from configs.actor import FSDPConfig, ModelConfig
from trainers.model import build_policy, check_adapter, gather_adapter, load_base_model, save_adapter

pytestmark = pytest.mark.integration
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg_adapter") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _saved_adapter(model_dir, folder, rank=8, alpha=16, target="all-linear"):
    """A LoRA on ``model_dir`` with random non-zero A and B, saved the way the trainer publishes one."""
    torch.manual_seed(3)
    model = load_base_model(ModelConfig(path=str(model_dir), lora_rank=rank, lora_alpha=alpha, target_modules=target),
                            lora=True)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data.normal_(0.0, 0.2)
    return save_adapter(model, get_peft_model_state_dict(model), folder)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """A Qwen2 like the test model but with hidden size 32 instead of 64."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("other_qwen2")
    config = Qwen2Config(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return folder


def test_build_policy_starts_from_the_saved_adapter(one_rank, grpo_model_dir, tmp_path, caplog):
    path = _saved_adapter(grpo_model_dir, tmp_path / "adapter", rank=8, alpha=16)
    check_adapter(path, str(grpo_model_dir))  # fits: no error
    cfg = ModelConfig(path=str(grpo_model_dir), lora_rank=4, lora_alpha=32)
    with caplog.at_level(logging.WARNING, logger="trainers.model"):
        model = build_policy(cfg, FSDPConfig(), CPU, seed=1, adapter_path=str(path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "r=8 lora_alpha=16" in warnings[0] and "lora_rank=4" in warnings[0]
    saved = load_file(str(path / "adapter_model.safetensors"))
    loaded = gather_adapter(model)
    assert loaded.keys() == saved.keys()
    for key, tensor in saved.items():
        torch.testing.assert_close(loaded[key], tensor, rtol=0, atol=0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_matching_config_loads_without_a_warning(one_rank, grpo_model_dir, tmp_path, caplog):
    path = _saved_adapter(grpo_model_dir, tmp_path / "adapter", rank=4, alpha=32)
    with caplog.at_level(logging.WARNING, logger="trainers.model"):
        build_policy(ModelConfig(path=str(grpo_model_dir), lora_rank=4, lora_alpha=32), FSDPConfig(), CPU, seed=1,
                     adapter_path=str(path))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_check_adapter_rejects_a_folder_without_adapter_config(grpo_model_dir, tmp_path):
    path = _saved_adapter(grpo_model_dir, tmp_path / "adapter")
    (path / "adapter_config.json").unlink()
    with pytest.raises(ValueError, match=rf"{path}.*no adapter_config.json"):
        check_adapter(path, str(grpo_model_dir))


def test_check_adapter_rejects_a_missing_weights_file(grpo_model_dir, tmp_path):
    path = _saved_adapter(grpo_model_dir, tmp_path / "adapter")
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match=rf"{path}.*no adapter weights file"):
        check_adapter(path, str(grpo_model_dir))


def test_check_adapter_rejects_an_adapter_for_another_base_model(grpo_model_dir, other_model_dir, tmp_path):
    path = _saved_adapter(other_model_dir, tmp_path / "adapter")
    # The first tensor (sorted names) is layer 0 down_proj: intermediate size 64 there, 128 here.
    expected = rf"{path}.*down_proj.*does not fit the base model.*lora_A has 64 inputs, the module 128"
    with pytest.raises(ValueError, match=expected):
        check_adapter(path, str(grpo_model_dir))


def test_check_adapter_rejects_a_target_module_the_base_model_lacks(grpo_model_dir, tmp_path):
    path = _saved_adapter(grpo_model_dir, tmp_path / "adapter", target=["q_proj", "v_proj"])
    config = (path / "adapter_config.json").read_text().replace('"q_proj"', '"c_attn"')
    (path / "adapter_config.json").write_text(config)
    with pytest.raises(ValueError, match=r"target modules \['c_attn'\] are not in the base model"):
        check_adapter(path, str(grpo_model_dir))
