"""The tiny model's chat template: ChatML laid out the way Qwen2.5 lays out tools (agents layer: data).

Layout, which the hermes / qwen25 tool parsers and the agent loop's chat-template deltas rely on:

- one system turn; with ``tools`` it lists each schema as one JSON line inside ``<tools></tools>`` and
  shows the ``<tool_call>`` call format; without a system message a default one is used, as Qwen2.5 does;
- an assistant turn with ``tool_calls`` puts each call on its own ``<tool_call>`` block after the content;
- consecutive ``tool`` messages become ONE user turn of ``<tool_response>`` blocks;
- ``add_generation_prompt`` opens an assistant turn.

The instruction sentences are our own wording; the token layout matches Qwen's templates, so a
conversation without ``tools`` and with a system message renders exactly as Qwen's template renders it.
"""

from __future__ import annotations

import json

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

TOOLS_HEADER = (
    "# Tools\n\nYou can call the functions described inside <tools></tools> to help with the request.\n\n"
    "<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a function, write one JSON object with the function name and its arguments "
    "between <tool_call></tool_call> tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _literal(text: str) -> str:
    # A JSON string literal is also a valid Jinja string literal (same escapes).
    return json.dumps(text, ensure_ascii=False)


_HEAD = (
    f"{{%- set default_system = {_literal(DEFAULT_SYSTEM_PROMPT)} -%}}\n"
    f"{{%- set tools_header = {_literal(TOOLS_HEADER)} -%}}\n"
    f"{{%- set tools_footer = {_literal(TOOLS_FOOTER)} -%}}\n"
)

_BODY = """{%- if messages and messages[0].role == "system" -%}
    {%- set system_text = messages[0].content -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system_text = default_system -%}
    {%- set turns = messages -%}
{%- endif -%}
{{- "<|im_start|>system\\n" + system_text -}}
{%- if tools -%}
    {{- (system_text and "\\n\\n" or "") + tools_header -}}
    {%- for tool in tools -%}
        {{- "\\n" + (tool | tojson) -}}
    {%- endfor -%}
    {{- tools_footer -}}
{%- endif -%}
{{- "<|im_end|>\\n" -}}
{%- for message in turns -%}
    {%- set content = message.content if message.content is string else "" -%}
    {%- if message.role == "tool" -%}
        {%- if loop.first or turns[loop.index0 - 1].role != "tool" -%}
            {{- "<|im_start|>user" -}}
        {%- endif -%}
        {{- "\\n<tool_response>\\n" + content + "\\n</tool_response>" -}}
        {%- if loop.last or turns[loop.index0 + 1].role != "tool" -%}
            {{- "<|im_end|>\\n" -}}
        {%- endif -%}
    {%- elif message.role == "assistant" and message.tool_calls -%}
        {{- "<|im_start|>assistant\\n" + content -}}
        {%- for call in message.tool_calls -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if content or not loop.first -%}
                {{- "\\n" -}}
            {%- endif -%}
            {{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
            {%- if fn.arguments is string -%}
                {{- fn.arguments -}}
            {%- else -%}
                {{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- "}\\n</tool_call>" -}}
        {%- endfor -%}
        {{- "<|im_end|>\\n" -}}
    {%- else -%}
        {{- "<|im_start|>" + message.role + "\\n" + content + "<|im_end|>\\n" -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- "<|im_start|>assistant\\n" -}}
{%- endif -%}
"""

CHAT_TEMPLATE = _HEAD + _BODY
