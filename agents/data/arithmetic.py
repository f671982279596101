"""The demo task: arithmetic questions an agent answers with or without the ``calculator`` tool (agents layer: pure).

Deterministic from a seed. Two kinds of problem, each its own ``data_source`` so validation reports them apart:
- ``tandem/arithmetic/easy``: one-digit sums and products, which a 135M-parameter pretrained model mostly gets
  right by itself;
- ``tandem/arithmetic/hard``: products of a two- or three-digit number and a two-digit one, which it almost never
  gets right by itself and always gets right by calling the calculator and copying its result.

Products:
- verl-format rows (``agent_name: tool_agent``) for GRPO and validation;
- SFT transcripts for a short cold start that teaches the answer form ("The answer is N.") and the tool-call
  format (hermes ``<tool_call>`` JSON, the one the chat template shows) while *under-using* the tool: only a
  ``tool_fraction`` of them call it. The cold-started model then answers most questions directly (and gets the
  hard ones wrong); GRPO has to find out that calling the calculator pays on the hard ones;
- ``score_answer``: verl's dict reward, ``{"score": acc, "acc": acc}`` — correctness only: 1 when the final
  "answer is N" states the right number, else 0. No credit for calling a tool or for the answer form, so
  neither a call on an unrelated expression nor a call that never ran can earn anything.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Literal

DATA_SOURCE = "tandem/arithmetic"
Kind = Literal["easy", "hard"]
KINDS: tuple[Kind, ...] = ("easy", "hard")
_QUESTION_TEMPLATES = (
    "What is {expr}?",
    "Compute {expr}.",
    "Calculate {expr}.",
    "How much is {expr}?",
)
_ANSWER = re.compile(r"answer is\s*\$?\s*(-?\d[\d,]*)", re.IGNORECASE)


def make_problem(rng: random.Random, kind: Kind) -> tuple[str, int]:
    """An expression of the given kind and its value."""
    if kind == "easy":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        op = rng.choice(("+", "*"))
    elif kind == "hard":
        a, b = rng.randint(12, 999), rng.randint(12, 99)
        op = "*"
    else:
        raise ValueError(f"unknown problem kind {kind!r}; expected one of {KINDS}")
    expr = f"{a} {op} {b}"
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


def data_source(kind: Kind) -> str:
    """The ``data_source`` of one kind of problem (``tandem/arithmetic/easy`` or ``/hard``): validation reports each."""
    return f"{DATA_SOURCE}/{kind}"


def make_rows(count: int, seed: int, split: str, *, hard_fraction: float = 0.5) -> list[dict[str, Any]]:
    """verl-format rows for the tool agent; ``hard_fraction`` of them hard (exactly, rounded), shuffled."""
    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction must be in [0, 1], got {hard_fraction}")
    rng = random.Random(f"{seed}-{split}")
    n_hard = round(count * hard_fraction)
    kinds: list[Kind] = ["hard"] * n_hard + ["easy"] * (count - n_hard)
    rng.shuffle(kinds)
    rows = []
    for index, kind in enumerate(kinds):
        expr, value = make_problem(rng, kind)
        question = rng.choice(_QUESTION_TEMPLATES).format(expr=expr)
        rows.append({
            "data_source": data_source(kind),
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"index": index, "question": question, "answer": str(value),
                           "tools_kwargs": {}, "split": split},
            "agent_name": "tool_agent",
        })
    return rows


def tool_call_text(expr: str) -> str:
    """A calculator call in the hermes format the chat template shows the model."""
    return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expr}}) + "\n</tool_call>"


def make_sft_transcripts(count: int, seed: int, tool_schemas: list[dict[str, Any]], *,
                         tool_fraction: float = 0.25) -> list[dict[str, Any]]:
    """Chat transcripts, half easy and half hard: a ``tool_fraction`` of them call the calculator and answer with
    its result, the rest answer at once with the right number (``call_format`` ``"hermes"`` or ``"none"``)."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"tool_fraction must be in [0, 1], got {tool_fraction}")
    rng = random.Random(f"{seed}-sft")
    out = []
    for i in range(count):
        expr, value = make_problem(rng, KINDS[i % 2])
        question = rng.choice(_QUESTION_TEMPLATES).format(expr=expr)
        answer = {"role": "assistant", "content": f"The answer is {value}."}
        if rng.random() >= tool_fraction:
            out.append({"tools": tool_schemas, "messages": [{"role": "user", "content": question}, answer],
                        "call_format": "none"})
            continue
        out.append({
            "tools": tool_schemas,
            "messages": [
                {"role": "user", "content": question},
                {"role": "assistant", "content": tool_call_text(expr)},
                {"role": "tool", "content": str(value)},
                answer,
            ],
            "call_format": "hermes",
        })
    return out


def extract_answer(text: str) -> int | None:
    """The last ``answer is N`` in ``text`` (thousands separators allowed), if any."""
    found = _ANSWER.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def score_answer(final_text: str, ground_truth: str) -> dict[str, float]:
    """verl's dict reward: ``score`` = ``acc`` = 1.0 when the final answer states ``ground_truth``, else 0.0."""
    answer = extract_answer(final_text)
    acc = float(answer is not None and str(answer) == str(ground_truth).strip())
    return {"score": acc, "acc": acc}
