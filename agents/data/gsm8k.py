"""GSM8K-style math rows (agents layer: pure).

Two sources of (question, answer, solution) problems: GSM8K records (``answer`` text ending in
``#### N``, from a local file or the hub) and reasoning-gym generators, which are deterministic for a
seed and need no network. Both become ``DatasetRow`` s shaped like verl's GSM8K multi-turn example:
the ``calc_gsm8k_reward`` tool gets the ground truth through ``tools_kwargs``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import reasoning_gym

from agents.data.rows import DataError, DatasetRow

AgentName = Literal["tool_agent", "single_turn_agent"]
GymDataset = Literal["gsm_symbolic", "basic_arithmetic", "chain_sum"]

GSM8K_TOOL = "calc_gsm8k_reward"

TOOL_SYSTEM_PROMPT = (
    "You are a careful math assistant. Work through the problem step by step before calling any tool. "
    f"Once you have a candidate answer, check it with the `{GSM8K_TOOL}` tool at least once and revise "
    "it if the tool says it is wrong. End your reply with the final answer as `#### <answer>`."
)
USER_SUFFIX = " Reason step by step, then give the final answer after `####`."


@dataclass(frozen=True)
class MathProblem:
    """One problem before it becomes a row. ``ground_truth`` is the bare final answer."""

    question: str
    ground_truth: str
    solution: str
    data_source: str


def gsm8k_final_answer(answer_text: str, where: str) -> str:
    """The number after ``#### `` in a GSM8K answer, commas removed (as verl's scorer compares)."""
    if "####" not in answer_text:
        raise DataError(f"{where}: key 'answer' has no '#### <number>' final answer")
    return answer_text.split("####")[-1].strip().replace(",", "")


def problems_from_gsm8k_records(
    records: list[dict[str, Any]], source_name: str, data_source: str = "openai/gsm8k"
) -> list[MathProblem]:
    """GSM8K records (``question``, ``answer``) to problems; errors name ``source_name`` and row."""
    problems = []
    for i, record in enumerate(records):
        where = f"{source_name} row {i}"
        for key in ("question", "answer"):
            if key not in record:
                raise DataError(f"{where}: missing key {key!r}")
            if not isinstance(record[key], str):
                raise DataError(f"{where}: key {key!r} must be a string, got {type(record[key]).__name__}")
        problems.append(
            MathProblem(
                question=record["question"],
                ground_truth=gsm8k_final_answer(record["answer"], where),
                solution=record["answer"],
                data_source=data_source,
            )
        )
    return problems


def _gym_entries(dataset: GymDataset, seed: int) -> Iterator[dict[str, Any]]:
    # reasoning-gym regenerates item i from (seed, i), so a generous size costs nothing up front.
    generated = reasoning_gym.create_dataset(dataset, size=1_000_000, seed=seed)
    for i in range(len(generated)):
        yield generated[i]


def problems_from_reasoning_gym(datasets: list[GymDataset], count: int, seed: int) -> list[MathProblem]:
    """``count`` distinct problems, drawn round-robin from ``datasets``, identical for a seed."""
    if not datasets:
        raise ValueError("need at least one reasoning-gym dataset")
    streams = [(name, _gym_entries(name, seed)) for name in datasets]
    seen: set[str] = set()
    problems: list[MathProblem] = []
    while len(problems) < count:
        name, stream = streams[len(problems) % len(streams)]
        entry = next(stream)
        if entry["question"] in seen:
            continue
        seen.add(entry["question"])
        answer = str(entry["answer"]).replace(",", "")
        # Some generators end their worked solution with "#### 8.0" for the answer "8": restate the
        # final line from the answer so the solution and the ground truth always agree.
        worked = str(entry.get("metadata", {}).get("answer_cot") or "").split("####")[0].rstrip()
        solution = f"{worked}\n#### {answer}" if worked else f"#### {answer}"
        problems.append(
            MathProblem(entry["question"], answer, solution, data_source=f"reasoning_gym/{name}")
        )
    return problems


def math_row(problem: MathProblem, index: int, split: str, agent_name: AgentName) -> DatasetRow:
    """A verl GSM8K row; ``tool_agent`` rows get the system prompt and the reward tool's kwargs."""
    user = {"role": "user", "content": problem.question + USER_SUFFIX}
    uses_tool = agent_name == "tool_agent"
    prompt = [{"role": "system", "content": TOOL_SYSTEM_PROMPT}, user] if uses_tool else [user]
    tools_kwargs = (
        {GSM8K_TOOL: {"create_kwargs": {"ground_truth": problem.ground_truth}}} if uses_tool else {}
    )
    return DatasetRow.model_validate(
        {
            "data_source": problem.data_source,
            "prompt": prompt,
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": problem.ground_truth},
            "extra_info": {
                "index": index,
                "question": problem.question,
                "answer": problem.solution,
                "split": split,
                "tools_kwargs": tools_kwargs,
            },
            "agent_name": agent_name,
        }
    )


def math_rows(problems: list[MathProblem], split: str, agent_name: AgentName) -> list[DatasetRow]:
    """One split's rows for ``agent_name``: ``math_row`` of each problem, indexed in order."""
    return [math_row(p, i, split, agent_name) for i, p in enumerate(problems)]
