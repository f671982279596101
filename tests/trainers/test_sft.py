"""SFT cold start: assistant-only loss masks from the real Qwen chat template; LoRA SFT on 2 Ray Train
workers through the CLI, merged into a plain HF model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "calculator", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]


def transcript(a: int, b: int) -> dict:
    return {"tools": TOOLS, "messages": [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": f"What is {a}+{b}?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": {"expr": f"{a}+{b}"}}}]},
        {"role": "tool", "content": str(a + b)},
        {"role": "assistant", "content": f"The answer is {a + b}."},
    ]}


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


def _masked_runs(tokenizer, ids, mask) -> list[str]:
    runs, current = [], []
    for token, m in zip(ids, mask):
        if m:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


@pytest.mark.unit
def test_loss_mask_covers_assistant_turns_only(qwen_tokenizer):
    from trainers.sft import tokenize_transcript

    t = tokenize_transcript(qwen_tokenizer, transcript(2, 3), "row 1")
    assert len(t.input_ids) == len(t.loss_mask)
    assert _masked_runs(qwen_tokenizer, t.input_ids, t.loss_mask) == [
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call><|im_end|>',
        # Qwen3's template gives the final assistant turn an empty think block: it is what the model says.
        "<think>\n\n</think>\n\nThe answer is 5.<|im_end|>",
    ]
    # The whole transcript is tokenized once, exactly as the chat template renders it.
    text = qwen_tokenizer.apply_chat_template(transcript(2, 3)["messages"], tools=TOOLS, tokenize=False)
    assert qwen_tokenizer.decode(t.input_ids) == text


@pytest.mark.unit
def test_bad_rows_are_named(qwen_tokenizer):
    from trainers.sft import tokenize_transcript

    with pytest.raises(ValueError, match="row 7: no assistant message"):
        tokenize_transcript(qwen_tokenizer, {"messages": [{"role": "user", "content": "hi"}]}, "row 7")
    with pytest.raises(ValueError, match="row 8: 'messages'"):
        tokenize_transcript(qwen_tokenizer, {"messages": []}, "row 8")


@pytest.fixture(scope="module")
def sft_base_model(tmp_path_factory, qwen_tokenizer):
    """A random 2-layer Qwen2 with the Qwen tokenizer's vocabulary, tokenizer saved alongside."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("sft_base")
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(qwen_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
    )).save_pretrained(folder)
    qwen_tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.integration
def test_a_shared_head_step_equals_the_unshared_step(sft_base_model, qwen_tokenizer):
    """The system prompt + tool schemas laid out once per micro-batch: the same loss and the same update."""
    import torch

    from configs.actor import ModelConfig
    from trainers.batching import plan_step
    from trainers.model import load_base_model
    from trainers.sft import _sft_step, shared_head, tokenize_transcript

    transcripts = [tokenize_transcript(qwen_tokenizer, transcript(a, b), f"row {a}") for a, b in
                   ((2, 3), (17, 40), (123, 9), (5, 5))]
    head = shared_head(transcripts)
    assert head > 50  # the rendered system prompt with the tool schema
    assert not any(any(t.loss_mask[:head]) for t in transcripts)
    assert len({t.input_ids[:head] for t in transcripts}) == 1 and len({t.input_ids[head] for t in transcripts}) > 1
    results = []
    for share in (False, True):
        torch.manual_seed(0)
        model = load_base_model(ModelConfig(path=str(sft_base_model), lora_rank=4, lora_alpha=8), lora=True)
        # SGD: the update is the gradient itself (Adam's first step is ~ its sign, which float noise flips)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        samples = [t.as_sample(i, head if share else 1) for i, t in enumerate(transcripts)]
        (plan,) = plan_step(samples, rank=0, world_size=1, groups_per_mini_batch=4, use_dynamic_bsz=True,
                            micro_batch_size=1, max_token_len=4096, share_prompts=share)
        loss = _sft_step(model, optimizer, samples, plan, torch.device("cpu"), share)
        results.append((loss, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}))
    (plain, plain_w), (shared, shared_w) = results
    assert shared == pytest.approx(plain, rel=1e-5)
    for name, weight in shared_w.items():
        torch.testing.assert_close(weight, plain_w[name], atol=1e-6, rtol=1e-4, msg=name)
    assert any(w.abs().max() > 1e-4 for n, w in shared_w.items() if "lora_B" in n)  # the step moved


@pytest.mark.unit
def test_shared_head_stops_before_the_first_loss_token(qwen_tokenizer):
    from trainers.sft import Transcript, shared_head

    same = Transcript((1, 2, 3, 4, 5), (0, 0, 0, 1, 1))
    assert shared_head([same, Transcript((1, 2, 3, 4, 6), (0, 0, 0, 1, 1))]) == 3  # 4 is learned: not shared
    assert shared_head([same, Transcript((1, 2, 9, 4, 5), (0, 0, 0, 1, 1))]) == 2
    assert shared_head([same, Transcript((7, 2, 3, 4, 5), (0, 0, 0, 1, 1))]) == 1  # nothing shared: one token
    with pytest.raises(ValueError, match="transcript 3: a 4-token head must be loss-free"):
        same.as_sample(3, head=4)


@pytest.mark.integration
@pytest.mark.slow
def test_lora_sft_through_the_cli_writes_a_merged_model(ray_cluster, sft_base_model, tmp_path, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    from apps.sft import main

    data = tmp_path / "sft.jsonl"
    rows = [transcript(a, b) for a, b in [(2, 3), (4, 4), (1, 7), (5, 2)]]
    long_row = transcript(1, 1)
    long_row["messages"][1]["content"] = "x " * 600  # over sft.max_length: dropped and counted
    data.write_text("\n".join(json.dumps(r) for r in [*rows, long_row]) + "\n")
    out = tmp_path / "sft_model"
    main([f"actor_rollout_ref.model.path={sft_base_model}", "actor_rollout_ref.model.lora_rank=8",
          f"sft.train_files={data}", f"sft.output_dir={out}", "sft.full_finetune=false", "sft.epochs=3",
          "sft.batch_size=2", "sft.lr=0.02", "sft.max_length=400", "trainer.n_gpus_per_node=2",
          "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.experiment_name=sft-test"])
    printed = capsys.readouterr().out
    assert "4 transcripts (1 dropped" in printed and "6 steps" in printed
    steps = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    first, last = sum(s["sft_loss"] for s in steps[:2]), sum(s["sft_loss"] for s in steps[-2:])
    assert last < first  # 3 passes over 4 transcripts at lr 0.02 memorise some of them
    merged = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(sft_base_model)
    merged_sd, base_sd = merged.state_dict(), base.state_dict()
    assert merged_sd.keys() == base_sd.keys()  # a plain model: LoRA merged away
    changed = [k for k in base_sd if not torch.equal(base_sd[k], merged_sd[k])]
    assert changed and all("proj" in k for k in changed)  # only the LoRA-targeted linear layers moved
    assert (Path(out) / "tokenizer.json").is_file() or (Path(out) / "tokenizer_config.json").is_file()
