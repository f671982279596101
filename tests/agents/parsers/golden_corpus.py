"""Golden corpus of model outputs with the calls, content and error count a parser must return.

Hand-written in the shapes Qwen2.5(-Coder), Qwen3 and friends produce on our two workloads: a
text-to-SQL agent (``run_sql`` over Chinook) and GSM8K with a ``calculator`` tool. ``expected`` is
what the model plainly meant, so it is the target of the universal ``qwen25_coder`` parser; the
benchmark (benchmarks/parser_accuracy.py) scores the strict parsers against the same targets.
Content is the text outside call blocks, each piece trimmed, pieces joined by newlines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GoldenCase:
    """One model output. ``calls`` are (name, arguments) pairs; ``errors`` counts malformed blocks."""

    case_id: str
    variant: str
    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    content: str = ""
    errors: int = 0


def _case(case_id: str, variant: str, text: str, calls: list[tuple[str, dict[str, Any]]], content: str,
          errors: int = 0) -> GoldenCase:
    return GoldenCase(case_id, variant, text, tuple(calls), content, errors)


def _negative(case_id: str, text: str) -> GoldenCase:
    """Not a call and not an error: the whole output is content."""
    return GoldenCase(case_id, "negative", text, (), text, 0)


Q_ARTISTS = "SELECT COUNT(*) FROM Artist"
Q_TOP = "SELECT Name, Milliseconds FROM Track ORDER BY Milliseconds DESC LIMIT 3"
Q_GENRE = "SELECT g.Name, COUNT(*) AS n FROM Track t JOIN Genre g ON t.GenreId = g.GenreId GROUP BY g.Name"

CORPUS: list[GoldenCase] = [
    # --- hermes, the format the chat template asks for -------------------------------------
    _case("hermes_sql", "hermes",
          f'<tool_call>\n{{"name": "run_sql", "arguments": {{"query": "{Q_ARTISTS}"}}}}\n</tool_call>',
          [("run_sql", {"query": Q_ARTISTS})], ""),
    _case("hermes_prose_first", "hermes",
          'I need the number of artists first.\n<tool_call>\n{"name": "run_sql", "arguments": '
          f'{{"query": "{Q_ARTISTS}"}}}}\n</tool_call>',
          [("run_sql", {"query": Q_ARTISTS})], "I need the number of artists first."),
    _case("hermes_two_calls", "hermes",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 / 2"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "48 + 24"}}\n</tool_call>',
          [("calculator", {"expression": "48 / 2"}), ("calculator", {"expression": "48 + 24"})], ""),
    _case("hermes_unicode", "hermes",
          '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT * FROM Artist WHERE Name = '
          '\'Antônio Carlos Jobim\'"}}\n</tool_call>',
          [("run_sql", {"query": "SELECT * FROM Artist WHERE Name = 'Antônio Carlos Jobim'"})], ""),
    _case("hermes_empty_args", "hermes",
          'Let me list the tables.\n<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>',
          [("list_tables", {})], "Let me list the tables."),
    _case("hermes_then_prose", "hermes",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3 * 17"}}\n</tool_call>\n'
          "I'll use the result to finish.",
          [("calculator", {"expression": "3 * 17"})], "I'll use the result to finish."),
    # --- <tools> tags -----------------------------------------------------------------------
    _case("tools_tag", "tools_tag",
          f'<tools>\n{{"name": "run_sql", "arguments": {{"query": "{Q_TOP}"}}}}\n</tools>',
          [("run_sql", {"query": Q_TOP})], ""),
    _case("tools_tag_list", "tools_tag",
          '<tools>\n[{"name": "calculator", "arguments": {"expression": "12 * 4"}}, '
          '{"name": "calculator", "arguments": {"expression": "48 - 5"}}]\n</tools>',
          [("calculator", {"expression": "12 * 4"}), ("calculator", {"expression": "48 - 5"})], ""),
    _case("tools_tag_prose", "tools_tag",
          'To answer, I will count the genres.\n<tools>\n{"name": "run_sql", "arguments": '
          f'{{"query": "{Q_GENRE}"}}}}\n</tools>',
          [("run_sql", {"query": Q_GENRE})], "To answer, I will count the genres."),
    # --- fenced JSON --------------------------------------------------------------------------
    _case("fence_json", "fence",
          f'```json\n{{"name": "run_sql", "arguments": {{"query": "{Q_ARTISTS}"}}}}\n```',
          [("run_sql", {"query": Q_ARTISTS})], ""),
    _case("fence_plain", "fence",
          '```\n{"name": "calculator", "arguments": {"expression": "7 * 8"}}\n```',
          [("calculator", {"expression": "7 * 8"})], ""),
    _case("fence_tool_call", "fence",
          '```tool_call\n{"name": "run_sql", "arguments": {"query": "SELECT Name FROM Genre"}}\n```',
          [("run_sql", {"query": "SELECT Name FROM Genre"})], ""),
    _case("fence_json_prose", "fence",
          'Let me query the database.\n\n```json\n{"name": "run_sql", "arguments": {"query": '
          '"SELECT Title FROM Album LIMIT 5"}}\n```\n\nThis returns five album titles.',
          [("run_sql", {"query": "SELECT Title FROM Album LIMIT 5"})],
          "Let me query the database.\nThis returns five album titles."),
    _case("fence_tool_call_inside", "tag_in_fence",
          '```\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "100 - 37"}}\n</tool_call>\n```',
          [("calculator", {"expression": "100 - 37"})], ""),
    _case("fence_json_tool_call_inside", "tag_in_fence",
          'Calling the tool:\n```json\n<tool_call>\n{"name": "run_sql", "arguments": {"query": '
          '"SELECT 1"}}\n</tool_call>\n```',
          [("run_sql", {"query": "SELECT 1"})], "Calling the tool:"),
    # --- bare JSON ----------------------------------------------------------------------------
    _case("bare_object", "bare",
          '{"name": "calculator", "arguments": {"expression": "15 * 4 + 3"}}',
          [("calculator", {"expression": "15 * 4 + 3"})], ""),
    _case("bare_after_prose", "bare",
          'First I compute the total cost. {"name": "calculator", "arguments": {"expression": "3 * 2.5"}}',
          [("calculator", {"expression": "3 * 2.5"})], "First I compute the total cost."),
    _case("bare_followed_by_prose", "bare",
          '{"name": "run_sql", "arguments": {"query": "SELECT COUNT(*) FROM Customer"}}\n'
          "Once I have the count I can answer.",
          [("run_sql", {"query": "SELECT COUNT(*) FROM Customer"})], "Once I have the count I can answer."),
    _case("bare_list", "bare",
          '[{"name": "calculator", "arguments": {"expression": "5 * 6"}}, '
          '{"name": "calculator", "arguments": {"expression": "30 / 3"}}]',
          [("calculator", {"expression": "5 * 6"}), ("calculator", {"expression": "30 / 3"})], ""),
    _case("bare_tool_calls_wrapper", "tool_calls_key",
          '{"tool_calls": [{"name": "run_sql", "arguments": {"query": "SELECT Name FROM MediaType"}}]}',
          [("run_sql", {"query": "SELECT Name FROM MediaType"})], ""),
    # --- shapes -------------------------------------------------------------------------------
    _case("openai_shape", "openai_shape",
          '<tool_call>\n{"type": "function", "function": {"name": "run_sql", "arguments": '
          '{"query": "SELECT 2"}}}\n</tool_call>',
          [("run_sql", {"query": "SELECT 2"})], ""),
    _case("openai_shape_bare_string_args", "openai_shape",
          '{"type": "function", "function": {"name": "calculator", '
          '"arguments": "{\\"expression\\": \\"9 * 9\\"}"}}',
          [("calculator", {"expression": "9 * 9"})], ""),
    _case("arguments_string", "arguments_string",
          '<tool_call>\n{"name": "run_sql", '
          '"arguments": "{\\"query\\": \\"SELECT COUNT(*) FROM Album\\"}"}\n</tool_call>',
          [("run_sql", {"query": "SELECT COUNT(*) FROM Album"})], ""),
    _case("parameters_key", "parameters_key",
          '<tool_call>\n{"name": "calculator", "parameters": {"expression": "60 * 24"}}\n</tool_call>',
          [("calculator", {"expression": "60 * 24"})], ""),
    _case("parameters_key_bare", "parameters_key",
          'Computing: {"name": "calculator", "parameters": {"expression": "1440 / 60"}}',
          [("calculator", {"expression": "1440 / 60"})], "Computing:"),
    _case("function_string", "function_string",
          '<tool_call>\n{"function": "run_sql", "arguments": {"query": "SELECT 3"}}\n</tool_call>',
          [("run_sql", {"query": "SELECT 3"})], ""),
    _case("python_dict", "python_dict",
          "<tool_call>\n{'name': 'run_sql', "
          "'arguments': {'query': 'SELECT \"Name\" FROM Artist LIMIT 2'}}\n</tool_call>",
          [("run_sql", {"query": 'SELECT "Name" FROM Artist LIMIT 2'})], ""),
    _case("python_dict_bare", "python_dict",
          "{'name': 'calculator', 'arguments': {'expression': '2 ** 10', 'exact': True}}",
          [("calculator", {"expression": "2 ** 10", "exact": True})], ""),
    _case("several_in_one_tag", "several_in_tag",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4 * 7"}}\n'
          '{"name": "calculator", "arguments": {"expression": "28 + 2"}}\n</tool_call>',
          [("calculator", {"expression": "4 * 7"}), ("calculator", {"expression": "28 + 2"})], ""),
    _case("stray_brace_tag", "stray_brace",
          '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 4"}}}\n</tool_call>',
          [("run_sql", {"query": "SELECT 4"})], ""),
    _case("stray_brace_bare", "stray_brace",
          'Next: {"name": "calculator", "arguments": {"expression": "17 - 9"}}}',
          [("calculator", {"expression": "17 - 9"})], "Next:"),
    _case("unclosed_tag", "unclosed_tag",
          'Let me check.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 5"}}',
          [("run_sql", {"query": "SELECT 5"})], "Let me check."),
    _case("unclosed_tag_after_call", "unclosed_tag",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4 * 4"}}\n',
          [("calculator", {"expression": "2 + 2"}), ("calculator", {"expression": "4 * 4"})], ""),
    _case("missing_close_between", "unclosed_tag",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6 + 1"}}\n'
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "7 * 3"}}\n</tool_call>',
          [("calculator", {"expression": "6 + 1"}), ("calculator", {"expression": "7 * 3"})], ""),
    _case("unclosed_tag_then_prose", "unclosed_tag",
          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "8 * 12"}}\nLet me wait for the result.',
          [("calculator", {"expression": "8 * 12"})], "Let me wait for the result."),
    # --- Qwen3 XML ----------------------------------------------------------------------------
    _case("qwen3_xml", "qwen3_xml",
          "<tool_call>\n<function=run_sql>\n<parameter=query>\nSELECT Name FROM Playlist\n</parameter>\n"
          "</function>\n</tool_call>",
          [("run_sql", {"query": "SELECT Name FROM Playlist"})], ""),
    _case("qwen3_xml_typed", "qwen3_xml",
          "I will compute it.\n<tool_call>\n<function=calculator>\n<parameter=expression>\n(12 + 8) / 4\n"
          "</parameter>\n<parameter=precision>\n2\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n"
          "</function>\n</tool_call>",
          [("calculator", {"expression": "(12 + 8) / 4", "precision": 2, "exact": True})], "I will compute it."),
    _case("qwen3_xml_two", "qwen3_xml",
          "<tool_call>\n<function=run_sql>\n<parameter=query>\nSELECT 1\n</parameter>\n</function>\n</tool_call>\n"
          "<tool_call>\n<function=run_sql>\n<parameter=query>\nSELECT 2\n</parameter>\n</function>\n</tool_call>",
          [("run_sql", {"query": "SELECT 1"}), ("run_sql", {"query": "SELECT 2"})], ""),
    # --- hard negatives: answers, code, maths; no call, no error ------------------------------
    _negative("neg_answer_json", '{"answer": 42}'),
    _negative("neg_answer_json_fence", 'Final result:\n```json\n{"answer": 42, "unit": "apples"}\n```'),
    _negative("neg_python_fence",
              "Here is how to call it:\n```python\n"
              "client.call({'name': 'run_sql', 'arguments': {'query': 'SELECT 1'}})\n```"),
    _negative("neg_sql_fence", "The query I would run:\n```sql\nSELECT Name FROM Artist WHERE ArtistId = 1;\n```"),
    _negative("neg_gsm8k_answer",
              "Natalia sold 48 / 2 = 24 clips in May.\nAltogether she sold 48 + 24 = 72 clips.\n#### 72"),
    _negative("neg_latex", "So the fraction is \\frac{3}{4} and the answer is \\boxed{75}."),
    _negative("neg_name_only", 'The top customer is {"name": "Luís Gonçalves", "total": 39.62}.'),
    _negative("neg_schema_echo",
              'The tool is defined as {"name": "run_sql", "parameters": {"type": "object", "properties": '
              '{"query": {"type": "string"}}}}.'),
    _negative("neg_number_list", "The first primes are [2, 3, 5, 7]."),
    _negative("neg_sql_result_rows",
              'The query returned [{"Name": "Rock", "n": 1297}, {"Name": "Latin", "n": 579}], so Rock wins.'),
    _negative("neg_prose_braces", "Use {curly braces} for sets, e.g. {1, 2}."),
    _negative("neg_tag_in_python_fence",
              'Example of the format:\n```python\n<tool_call>\n{"name": "run_sql", "arguments": {}}\n'
              "</tool_call>\n```"),
    # --- malformed calls: errors, never invented calls ----------------------------------------
    _case("err_missing_brace", "error",
          'Querying.\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 6"}\n</tool_call>',
          [], "Querying.", errors=1),
    _case("err_empty_tag", "error", "Let me think.\n<tool_call>\n</tool_call>", [], "Let me think.", errors=1),
    _case("err_no_name", "error",
          '<tool_call>\n{"arguments": {"query": "SELECT 7"}}\n</tool_call>', [], "", errors=1),
    _case("err_bad_arguments", "error",
          '<tool_call>\n{"name": "calculator", "arguments": [1, 2]}\n</tool_call>', [], "", errors=1),
    _case("err_truncated_bare", "error",
          'Computing now. {"name": "calculator", "arguments": {"expression": "123 * 45',
          [], "Computing now.", errors=1),
    _case("err_one_good_one_bad", "error",
          '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 8"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 9"\n</tool_call>',
          [("run_sql", {"query": "SELECT 8"})], "", errors=1),
    _case("err_schema_echo_in_tools", "error",
          '<tools>\n[{"type": "function", "function": {"name": "run_sql", "description": "Run SQL", "parameters": '
          '{"type": "object", "properties": {"query": {"type": "string"}}}}}]\n</tools>', [], "", errors=1),
    _case("err_xml_no_function", "error",
          "<tool_call>\n<parameter=query>\nSELECT 10\n</parameter>\n</tool_call>", [], "", errors=1),
]

VARIANTS = sorted({case.variant for case in CORPUS})
