"""vLLM tool-parser plugin (adapter layer: the one module under agents/ that touches vLLM).

``register`` is the ``vllm.general_plugins`` entry point (setup.cfg): vLLM calls it once per
process, and it registers the ``qwen25_coder`` and ``qwen3_xml`` formats with vLLM's
``ToolParserManager`` so ``--tool-call-parser qwen25_coder --enable-auto-tool-choice`` (or
``engine_kwargs.vllm.tool_call_parser``) uses the same parsers as the agent loop. vLLM is imported
only inside ``register``: importing ``agents.parsers`` never imports vLLM.

Every vLLM layout we know works: since 0.32 ``vllm.tool_parsers`` and
``vllm.entrypoints.generate.base.protocol``; the 0.2x releases ``vllm.tool_parsers`` and
``vllm.entrypoints.openai.engine.protocol``; older ones ``vllm.entrypoints.openai.tool_parsers`` and
``vllm.entrypoints.openai.protocol``.
The classes here only translate records: parsing is ``agents.parsers``, streaming is
``agents.parsers.streaming.ToolCallStream``.
"""

from __future__ import annotations

import importlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agents.parsers import parse_tool_calls, strip_end_markers
from agents.parsers.streaming import StreamDelta, ToolCallStream
from agents.records import ParsedToolCalls

PLUGIN_FORMATS = ("qwen25_coder", "qwen3_xml")


@dataclass(frozen=True)
class _VllmApi:
    """The vLLM classes the adapter needs, from whichever layout is installed."""

    tool_parser: type
    manager: type
    extracted: type
    tool_call: type
    function_call: type
    delta_message: type
    delta_tool_call: type
    delta_function_call: type


# Where each piece lives, newest layout first: vLLM >= 0.32, the 0.2x releases (verl's [vllm] extra
# pins 0.24), and older ones that kept everything under vllm.entrypoints.openai.
_TOOL_PARSER_MODULES = ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
_PROTOCOL_MODULES = (
    "vllm.entrypoints.generate.base.protocol",
    "vllm.entrypoints.openai.engine.protocol",
    "vllm.entrypoints.openai.protocol",
)


def _first_module(paths: tuple[str, ...]) -> ModuleType:
    for path in paths:
        try:
            return importlib.import_module(path)
        except ModuleNotFoundError as exc:
            if exc.name is None or not path.startswith(exc.name):
                raise  # the module exists but one of its own imports is missing: show that
    raise ModuleNotFoundError(f"none of {paths} is importable from the installed vLLM")


def _import_vllm() -> _VllmApi:
    parsers = _first_module(_TOOL_PARSER_MODULES)
    protocol = _first_module(_PROTOCOL_MODULES)
    return _VllmApi(
        tool_parser=parsers.ToolParser,
        manager=parsers.ToolParserManager,
        extracted=protocol.ExtractedToolCallInformation,
        tool_call=protocol.ToolCall,
        function_call=protocol.FunctionCall,
        delta_message=protocol.DeltaMessage,
        delta_tool_call=protocol.DeltaToolCall,
        delta_function_call=protocol.DeltaFunctionCall,
    )


def register() -> None:
    """Register our formats with vLLM's ToolParserManager (replacing same-named built-ins)."""
    api = _import_vllm()
    for fmt in PLUGIN_FORMATS:
        api.manager.register_module(name=fmt, force=True, module=_parser_class(api, fmt))


def _parser_class(api: _VllmApi, fmt: str) -> type:
    """A ``ToolParser`` subclass for ``fmt``; built here because its base class lives in vLLM."""

    class TandemToolParser(api.tool_parser):  # type: ignore[name-defined,misc]
        # vLLM's serving layer (0.24 and 0.33 checked) calls finish_streaming() at the end of a
        # stream only for parsers that set this; it is how held-back text and a call the model
        # never closed get released. Such parsers are handed deltas only, hence _streamed_text.
        engine_based_streaming = True

        def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(tokenizer, *args, **kwargs)
            self._stream = ToolCallStream(fmt)
            self._streamed_text = ""

        def adjust_request(self, request: Any) -> Any:
            request = super().adjust_request(request)
            if getattr(request, "tools", None) and getattr(request, "tool_choice", None) != "none":
                # Call markers are special tokens in some tokenizers; keep them in the text.
                request.skip_special_tokens = False
            return request

        def extract_tool_calls(self, model_output: str, request: Any) -> Any:
            text = strip_end_markers(model_output, self.model_tokenizer)
            return _extracted(api, text, parse_tool_calls(text, fmt))

        def extract_tool_calls_streaming(
            self,
            previous_text: str,
            current_text: str,
            delta_text: str,
            previous_token_ids: Sequence[int],
            current_token_ids: Sequence[int],
            delta_token_ids: Sequence[int],
            request: Any,
        ) -> Any:
            # current_text is the whole text only for legacy parsers; delta_text is always the news.
            self._streamed_text += delta_text
            return _delta_message(api, self, self._stream.feed(self._streamed_text))

        def finish_streaming(self) -> Any:
            return _delta_message(api, self, self._stream.finish())

    name = "Tandem" + "".join(part.title() for part in fmt.split("_")) + "ToolParser"
    TandemToolParser.__name__ = TandemToolParser.__qualname__ = name
    return TandemToolParser


def _extracted(api: _VllmApi, text: str, parsed: ParsedToolCalls) -> Any:
    """Non-streaming answer. Without calls the text goes back verbatim (a broken block included)."""
    if not parsed.calls:
        return api.extracted(tools_called=False, tool_calls=[], content=text)
    tool_calls = [
        api.tool_call(
            type="function",
            function=api.function_call(name=call.name, arguments=json.dumps(call.arguments, ensure_ascii=False)),
        )
        for call in parsed.calls
    ]
    return api.extracted(tools_called=True, tool_calls=tool_calls, content=parsed.content or None)


def _delta_message(api: _VllmApi, parser: Any, delta: StreamDelta) -> Any:
    """One streamed chunk; each call is sent whole (name and all arguments) when it completes."""
    if not delta.content and not delta.calls:
        return None
    tool_calls = []
    for call in delta.calls:
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        index = len(parser.prev_tool_call_arr)
        # The serving layer reads these to send arguments a parser left unstreamed; keeping them
        # equal tells it nothing is left.
        parser.prev_tool_call_arr.append({"name": call.name, "arguments": call.arguments})
        parser.streamed_args_for_tool.append(arguments)
        parser.current_tool_id = index
        tool_calls.append(
            api.delta_tool_call(
                index=index,
                id=f"chatcmpl-tool-{uuid.uuid4().hex}",
                type="function",
                function=api.delta_function_call(name=call.name, arguments=arguments),
            )
        )
    return api.delta_message(content=delta.content or None, tool_calls=tool_calls)
