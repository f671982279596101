"""The demo task: arithmetic word problems solved with the ``calculator`` tool (agents layer: pure).

Deterministic from a seed. Three products:
- verl-format rows (``agent_name: tool_agent``) for GRPO,
- SFT transcripts whose tool calls are written in *mixed* formats (hermes tags, ``<tools>``,
  fenced JSON, bare JSON, OpenAI shape, qwen3 XML) so the cold-started model emits all of them and
  only the universal ``qwen25_coder`` parser reads every one; optionally some answer without the tool,
- ``score_answer``: 1.0 when the last assistant message states the right number; 0.5 when the episode
  made a successful calculator call and then stated a number in the answer form (``The answer is N.``)
  that is wrong; else 0. The partial credit is what a
  one-million-parameter model can earn: it learns the tool-use protocol and the answer form from SFT
  and RL, but not to copy multi-digit numbers within a CPU demo's budget (measured: 0/64 exact after
  a 225-step SFT), so an exact-match-only reward would give GRPO no signal at all.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

DATA_SOURCE = "tandem/arithmetic"
_OPS = ("+", "-", "*")
_QUESTION_TEMPLATES = (
    "What is {expr}?",
    "Compute {expr}.",
    "Calculate {expr} for me.",
    "Use the calculator: {expr}",
)
_ANSWER = re.compile(r"answer is\s*(-?\d+)", re.IGNORECASE)


def make_problem(rng: random.Random) -> tuple[str, int]:
    """An expression of two or three small integers and its value."""
    terms = [rng.randint(2, 99) for _ in range(rng.choice((2, 2, 3)))]
    ops = [rng.choice(_OPS) for _ in terms[1:]]
    expr = str(terms[0])
    for op, term in zip(ops, terms[1:]):
        expr += f" {op} {term}"
    return expr, _evaluate(expr)


def _evaluate(expr: str) -> int:
    tokens = expr.split()
    # '*' binds tighter than '+'/'-': fold products first, then left to right.
    values: list[int] = [int(tokens[0])]
    signs: list[str] = []
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            values[-1] *= int(num)
        else:
            signs.append(op)
            values.append(int(num))
    total = values[0]
    for sign, value in zip(signs, values[1:]):
        total = total + value if sign == "+" else total - value
    return total


def make_rows(count: int, seed: int, split: str) -> list[dict[str, Any]]:
    """verl-format rows for the tool agent."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(count):
        expr, value = make_problem(rng)
        question = rng.choice(_QUESTION_TEMPLATES).format(expr=expr)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"index": index, "question": question, "answer": str(value),
                           "tools_kwargs": {}, "split": split},
            "agent_name": "tool_agent",
        })
    return rows


def _call_text(fmt: str, expr: str) -> str:
    call = {"name": "calculator", "arguments": {"expression": expr}}
    compact = json.dumps(call)
    table = {
        "hermes": f"<tool_call>\n{compact}\n</tool_call>",
        "tools_tag": f"<tools>\n{compact}\n</tools>",
        "fenced": f"```json\n{compact}\n```",
        "bare": compact,
        "openai": json.dumps({"type": "function", "function": call}),
        "qwen3_xml": (f"<tool_call>\n<function=calculator>\n<parameter=expression>\n{expr}\n"
                      f"</parameter>\n</function>\n</tool_call>"),
    }
    return table[fmt]


CALL_FORMATS = ("hermes", "tools_tag", "fenced", "bare", "openai", "qwen3_xml")


def make_sft_transcripts(count: int, seed: int, tool_schemas: list[dict[str, Any]], *,
                         direct_fraction: float = 0.0) -> list[dict[str, Any]]:
    """Chat transcripts: question → tool call (mixed formats) → tool result → answer.

    A ``direct_fraction`` of them answer at once without the tool (``call_format`` ``"none"``), as a model
    that under-uses its tools would: the cold-started model then calls the calculator only part of the time,
    and GRPO has to learn that calling it pays (a direct answer is right only if the model can do the
    arithmetic itself, which a tiny model cannot).
    """
    if not 0.0 <= direct_fraction <= 1.0:
        raise ValueError(f"direct_fraction must be in [0, 1], got {direct_fraction}")
    rng = random.Random(f"{seed}-sft")
    out = []
    with_tool = 0
    for _ in range(count):
        expr, value = make_problem(rng)
        question = rng.choice(_QUESTION_TEMPLATES).format(expr=expr)
        answer = {"role": "assistant", "content": f"The answer is {value}."}
        if rng.random() < direct_fraction:
            out.append({"tools": tool_schemas, "messages": [{"role": "user", "content": question}, answer],
                        "call_format": "none"})
            continue
        fmt = CALL_FORMATS[with_tool % len(CALL_FORMATS)]
        with_tool += 1
        out.append({
            "tools": tool_schemas,
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": _call_text(fmt, expr)},
                {"role": "tool", "content": str(value)},
                answer,
            ],
            "call_format": fmt,
        })
    return out


def extract_answer(text: str) -> int | None:
    """The last ``answer is N`` in ``text``, if any."""
    found = _ANSWER.findall(text)
    return int(found[-1]) if found else None


FORMAT_CREDIT = 0.5


def score_answer(final_text: str, ground_truth: str, *, num_tool_calls: int = 0, num_tool_errors: int = 0) -> float:
    """1.0 for the right number; ``FORMAT_CREDIT`` for a wrong number in the answer form after at least one
    calculator call that succeeded (so answering without the tool earns nothing); else 0.0."""
    answer = extract_answer(final_text)
    if answer is None:
        return 0.0
    if str(answer) == str(ground_truth).strip():
        return 1.0
    return FORMAT_CREDIT if num_tool_calls - num_tool_errors > 0 else 0.0
