"""The tiny local model: tokenizer tokens, chat template (tiny and real Qwen), reload, seed determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from apps.make_tiny_model import TOOL_TOKENS, build_tiny_model, main, train_tokenizer
from deployments.model_paths import resolve_model_path

SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
SCHEMA = {
    "type": "function",
    "function": {
        "name": "execute_sql",
        "description": "Run SQL.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
CONVERSATION = [
    {"role": "system", "content": "You are a SQL expert."},
    {"role": "user", "content": "How many tracks?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "execute_sql", "arguments": {"query": "SELECT 1"}}}
        ],
    },
    {"role": "tool", "content": "[[3503]]"},
    {"role": "tool", "content": "ok"},
]
SCHEMA_LINE = (
    '{"type": "function", "function": {"name": "execute_sql", "description": "Run SQL.", "parameters": '
    '{"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}'
)
# Everything after the system turn; identical for the tiny and the real Qwen template.
TURNS = (
    "<|im_start|>user\nHow many tracks?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n"
    '{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n[[3503]]\n</tool_response>\n"
    "<tool_response>\nok\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)
TEXTS = (
    "Hello world! It's 2024.\n\n  indented",
    'SELECT c.Name, COUNT(*) FROM Customer c WHERE c.Country = "Brazil";',
    "Ünïcödé café — 東京 😀 \t tabs",
    '<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def qwen_tokenizer(qwen_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen_tokenizer_dir)


@pytest.mark.unit
@pytest.mark.parametrize("token", SPECIAL_TOKENS + TOOL_TOKENS)
def test_chatml_and_tool_tokens_are_single_ids(tiny_tokenizer, token):
    ids = tiny_tokenizer.encode(token, add_special_tokens=False)
    assert len(ids) == 1
    assert tiny_tokenizer.convert_ids_to_tokens(ids) == [token]
    assert tiny_tokenizer.decode(ids) == token
    # The same token inside text is still one id, not merged with its neighbours.
    assert tiny_tokenizer.encode(f"a{token}b", add_special_tokens=False).count(ids[0]) == 1


@pytest.mark.unit
def test_special_token_roles(tiny_tokenizer):
    assert tiny_tokenizer.eos_token == "<|im_end|>"
    assert tiny_tokenizer.pad_token == "<|endoftext|>"
    text = "<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    # Tool tokens are not "special": a parser still sees them after skip_special_tokens.
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"
    all_ids = tiny_tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS + TOOL_TOKENS))
    assert len(set(all_ids)) == 9


@pytest.mark.unit
@pytest.mark.parametrize("text", TEXTS)
def test_reload_tokenizes_like_the_trained_tokenizer(tiny_tokenizer, text):
    trained = train_tokenizer(vocab_size=3000, seed=0)
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert ids == trained.encode(text).ids
    assert tiny_tokenizer.decode(ids) == text


@pytest.mark.unit
def test_digits_split_one_per_token_like_qwen(tiny_tokenizer):
    pieces = tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer.encode("x 2024", add_special_tokens=False))
    assert pieces[-4:] == ["2", "0", "2", "4"]


@pytest.mark.unit
def test_vocab_size_and_config_agree(tiny_tokenizer, tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert 2000 <= len(tiny_tokenizer) <= 4096
    assert config["vocab_size"] == len(tiny_tokenizer)
    assert config["eos_token_id"] == tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config["tie_word_embeddings"] is True


@pytest.mark.unit
def test_tiny_chat_template_with_tools_and_tool_messages(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        CONVERSATION, tools=[SCHEMA], add_generation_prompt=True, tokenize=False
    )
    expected = (
        "<|im_start|>system\nYou are a SQL expert.\n\n# Tools\n\n"
        "You can call the functions described inside <tools></tools> to help with the request.\n\n"
        f"<tools>\n{SCHEMA_LINE}\n</tools>\n\n"
        "To call a function, write one JSON object with the function name and its arguments "
        "between <tool_call></tool_call> tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        + TURNS
    )
    assert text == expected


@pytest.mark.unit
def test_real_qwen_chat_template_with_tools_and_tool_messages(qwen_tokenizer):
    qwen = qwen_tokenizer
    text = qwen.apply_chat_template(CONVERSATION, tools=[SCHEMA], add_generation_prompt=True, tokenize=False)
    expected = (
        "<|im_start|>system\nYou are a SQL expert.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{SCHEMA_LINE}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        + TURNS
    )
    assert text == expected
    ids = qwen.encode(text, add_special_tokens=False)
    assert ids.count(qwen.convert_tokens_to_ids("<tool_response>")) == 2


@pytest.mark.unit
def test_tiny_and_qwen_templates_agree_without_tools(tiny_tokenizer, qwen_tokenizer):
    qwen = qwen_tokenizer
    tiny_text = tiny_tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    qwen_text = qwen.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=False)
    assert tiny_text == qwen_text == "<|im_start|>system\nYou are a SQL expert.<|im_end|>\n" + TURNS


@pytest.mark.unit
def test_tiny_template_default_system_and_string_arguments(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"function": {"name": "f", "arguments": '{"x": 1}'}},
                {"function": {"name": "g", "arguments": {}}},
            ],
        },
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call><|im_end|>\n'
    )


@pytest.mark.unit
def test_template_ids_equal_encoding_of_rendered_text(tiny_tokenizer):
    text = tiny_tokenizer.apply_chat_template(
        CONVERSATION, tools=[SCHEMA], add_generation_prompt=True, tokenize=False
    )
    ids = tiny_tokenizer.apply_chat_template(
        CONVERSATION, tools=[SCHEMA], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids) == text


@pytest.mark.integration
def test_model_reloads_and_generates(tiny_model_dir, tiny_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tiny_tokenizer.apply_chat_template(
        CONVERSATION[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]  # [1, T]
    with torch.no_grad():
        logits = model(ids).logits  # [1, T, V]
        out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert logits.shape == (1, ids.shape[1], len(tiny_tokenizer))
    assert out.shape[1] > ids.shape[1]
    assert torch.equal(out[:, : ids.shape[1]], ids)


@pytest.mark.integration
def test_weights_and_tokenizer_are_deterministic_from_seed(tmp_path, tiny_model_dir, capsys):
    from safetensors.torch import load_file

    main(["--out", str(tmp_path / "same")])
    assert "tiny model written to" in capsys.readouterr().out
    other = build_tiny_model(tmp_path / "other", seed=1)
    reference = load_file(tiny_model_dir / "model.safetensors")
    same = load_file(tmp_path / "same" / "model.safetensors")
    different = load_file(other / "model.safetensors")
    assert reference.keys() == same.keys() == different.keys()
    assert all(reference[k].equal(same[k]) for k in reference)
    assert not all(reference[k].equal(different[k]) for k in reference)
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tiny_model_dir / name).read_bytes() == (tmp_path / "same" / name).read_bytes()


@pytest.mark.unit
def test_resolve_model_path_local_folder(tiny_model_dir):
    assert resolve_model_path(tiny_model_dir) == str(Path(tiny_model_dir).resolve())


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["not a model id!", "no/such/local/folder"])
def test_resolve_model_path_rejects_non_model(bad):
    with pytest.raises(FileNotFoundError, match="neither a local folder nor a hub id"):
        resolve_model_path(bad)


@pytest.mark.unit
def test_resolve_model_path_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_path(tmp_path)
