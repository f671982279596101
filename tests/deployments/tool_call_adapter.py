"""A LoRA adapter that makes the random tiny model answer one fixed question with a tool call (test helper).

The tiny model's weights are random, so it never writes a tool call by itself. This adapter is built in
closed form instead of trained: a LoRA on ``lm_head`` only leaves the hidden states unchanged, so with
``H`` = the final hidden states [R, hidden] at the R answer positions (teacher-forced on the wanted answer),
``A = (H Hᵀ)⁻¹ H`` maps each of them to a unit vector (``A h_s = e_s``) and ``B = margin · onehot(target)``
turns that into a logit bonus for exactly the wanted token. Greedy decoding of the prompt then yields
``TOOL_CALL_TEXT`` + EOS with a wide margin; served through the rollout app, the OpenAI endpoint must return
it as a parsed ``tool_calls`` entry. Takes about a second.
"""

from __future__ import annotations

from pathlib import Path

import torch

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def build_tool_call_adapter(model_dir: Path, out_dir: Path, margin: float = 50.0) -> Path:
    """Write a peft LoRA adapter (on ``lm_head``) whose greedy answer to ``MESSAGES`` is the tool call."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    target = tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: captured.append(args[0]))
    with torch.no_grad():
        model(torch.tensor([prompt + target[:-1]]))
    hook.remove()
    hidden = captured[0][0, len(prompt) - 1 :]  # [R, hidden]: the states that predict each answer token
    rank = hidden.shape[0]
    lora_a = torch.linalg.solve(hidden @ hidden.T, hidden)  # [R, hidden], lora_a @ h_s = e_s
    lora_b = torch.zeros(model.config.vocab_size, rank)  # [V, R]
    lora_b[torch.tensor(target), torch.arange(rank)] = margin
    peft_model = get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=["lm_head"])
    )
    layer = peft_model.base_model.model.lm_head
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(lora_a)
        layer.lora_B["default"].weight.copy_(lora_b)
    # The adapter alone: lm_head is tied to the embeddings, which must not travel with it.
    peft_model.save_pretrained(out_dir, save_embedding_layers=False)
    return Path(out_dir)
