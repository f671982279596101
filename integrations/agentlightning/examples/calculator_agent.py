"""An Agent Lightning 0.3.x agent on tandem-rl's arithmetic demo task, trained by ``Trainer.fit`` with
``tandem_rl_agl.TandemRL`` as its algorithm (run it with Agent Lightning's interpreter, ``.venv-agl03/bin/python``;
``python -m benchmarks.agl_learning`` prepares the demo and starts it).

The agent is what an Agent Lightning user writes, with nothing of tandem-rl in it: an OpenAI tool-calling loop over
the rollout's own base URL (``main_llm``), a local ``calculator`` function, up to three assistant turns, and a reward
that is the answer's correctness ("The answer is N." states the task's number: 1, else 0). Training rollouts sample
at the algorithm's temperature; validation rollouts (``rollout.mode == "val"``) decode greedily, as the demo
validates. tandem-rl reads the reward from the rollout's spans and the calls from its ingress.

    .venv-agl03/bin/python integrations/agentlightning/examples/calculator_agent.py \\
        --train .cache/demo/data/train.jsonl --val .cache/demo/data/val.jsonl \\
        --config configs/demo_cpu.yaml --python .venv/bin/python [dotted.key=value ...]
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
from pathlib import Path

import agentlightning as agl
from openai import OpenAI
from tandem_rl_agl import TandemRL

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "For example '(12.5 - 2) * 3 / 7'."}},
            "required": ["expression"]},
    },
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}
ANSWER = re.compile(r"answer is\s*\$?\s*(-?\d[\d,]*)", re.IGNORECASE)
MAX_TURNS = 3


def calculate(expression: str) -> str:
    """The calculator tool: + - * / // % over numbers (no names, no calls, no powers), as text."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression: {ast.dump(node)[:60]}")

    try:
        value = walk(ast.parse(str(expression)[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.12g}"


def correct(text: str, answer: str) -> float:
    """The reward: 1.0 when the last "answer is N" in ``text`` states ``answer``, else 0.0."""
    found = ANSWER.findall(text or "")
    return float(bool(found) and found[-1].replace(",", "") == str(answer).strip())


class CalculatorAgent(agl.LitAgent):
    """The agent: an OpenAI tool-calling loop over the rollout's own base URL, rewarded by the answer's correctness."""

    def rollout(self, task, resources, rollout):
        llm = resources["main_llm"]
        client = OpenAI(base_url=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                        api_key="unused", max_retries=2, timeout=600)
        greedy = rollout.mode != "train"
        messages = list(task["prompt"])
        text = ""
        for _ in range(MAX_TURNS):
            response = client.chat.completions.create(
                model=llm.model, messages=messages, tools=[CALCULATOR], max_tokens=96,
                temperature=0.0 if greedy else llm.sampling_parameters.get("temperature", 1.0))
            message = response.choices[0].message
            text = message.content or ""
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                try:
                    expression = json.loads(call.function.arguments).get("expression", "")
                except (json.JSONDecodeError, AttributeError):
                    expression = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
        return correct(text, task["answer"])


def tasks(path: Path) -> list[dict]:
    """The demo's rows (JSON lines) as Agent Lightning tasks: the chat prompt, the number, the row's data_source (so
    tandem-rl's validation reports easy and hard apart)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"prompt": r["prompt"], "answer": r["reward_model"]["ground_truth"], "data_source": r["data_source"]}
            for r in rows]


def main() -> None:
    """``Trainer.fit`` of the agent on the demo's rows, with tandem-rl's algorithm in place of ``agl.VERL``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--val", type=Path, required=True)
    parser.add_argument("--config", required=True, help="tandem-rl's config (the demo's: configs/demo_cpu.yaml)")
    parser.add_argument("--python", required=True, help="tandem-rl's interpreter")
    parser.add_argument("--cwd", default=".", help="where tandem-rl runs (its repository)")
    parser.add_argument("--serve-port", type=int, default=8000)
    parser.add_argument("--store-port", type=int, default=4747)
    parser.add_argument("--runners", type=int, default=4)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    algorithm = TandemRL(args.config, args.overrides, python=args.python, cwd=args.cwd, serve_port=args.serve_port)
    trainer = agl.Trainer(n_runners=args.runners, algorithm=algorithm, port=args.store_port)
    trainer.fit(CalculatorAgent(), train_dataset=tasks(args.train), val_dataset=tasks(args.val))


if __name__ == "__main__":
    main()
