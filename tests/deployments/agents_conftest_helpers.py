"""Integration helpers for agent-worker tests: a tiny model that calls SQL tools, Ray + the rollout app.

A randomly initialised tiny model never writes a well-formed ``<tool_call>``; no real instruct model can
be downloaded here. So ``teach_sql_tool_use`` fine-tunes the tiny model (~40 s on one core, in the background: see
``sql_model_dir``) on real SQL episodes (system + question, an ``execute_sql`` call, the real tool answer, the gold
query) rendered with its own chat template. The result is a real model served by the real engine that writes tool calls,
mostly well-formed, sometimes not: both paths of the agent loop get exercised by sampled output.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.data.rows import DatasetRow
from agents.data.sql_tasks import sql_row, sql_tasks
from tests.background import started

TAUGHT_ROWS = 3
SQL_TOOL_CONFIG: dict[str, Any] = {
    "tools": [
        {"class_name": "search_schema", "config": {}},
        {"class_name": "get_columns", "config": {}},
        {"class_name": "execute_sql", "config": {"timeout_s": 2.0, "max_rows": 20, "max_output_chars": 600}},
    ]
}


def sql_rows(db_path: Path, count: int, distinct: int | None = None) -> list[DatasetRow]:
    """``count`` tool_agent rows cycling over the first ``distinct`` insurance questions (default: all).

    The taught model has seen the first ``TAUGHT_ROWS`` questions; later ones get less regular output.
    """
    tasks = sql_tasks("insurance")[:distinct]
    return [sql_row(tasks[i % len(tasks)], db_path, i, "train") for i in range(count)]


async def _tool_answer(db_path: Path, query: str) -> str:
    from agents.tools.registry import load_tools

    tool = load_tools(SQL_TOOL_CONFIG)["execute_sql"]
    await tool.create("teach", db_path=str(db_path))
    try:
        return await tool.execute("teach", {"query": query})
    finally:
        await tool.release("teach")


def _teaching_conversation(row: DatasetRow, db_path: Path) -> list[dict[str, Any]]:
    gold = str(row.reward_model.ground_truth)
    call = {"type": "function", "function": {"name": "execute_sql", "arguments": json.dumps({"query": gold})}}
    answer = asyncio.run(_tool_answer(db_path, gold))
    return [
        *row.messages(),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": f"```sql\n{gold}\n```"},
    ]


def teach_sql_tool_use(base_dir: Path, out_dir: Path, db_path: Path, *, num_rows: int = TAUGHT_ROWS,
                      max_steps: int = 600, target_loss: float = 0.005) -> Path:
    """Copy the tiny model to ``out_dir`` and fine-tune it on SQL tool-use episodes (loss on assistant turns)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agents.tools.registry import load_tools

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    schemas = [t.schema for t in load_tools(SQL_TOOL_CONFIG).values()]
    start = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    batch = []
    for row in sql_rows(db_path, num_rows):
        ids = tokenizer.apply_chat_template(
            _teaching_conversation(row, db_path), tools=schemas, tokenize=True, return_dict=False
        )
        labels = [-100] * len(ids)
        i = 0
        while i < len(ids):  # label every assistant turn's content and its <|im_end|>
            if ids[i : i + len(start)] == start:
                j = i + len(start)
                while j < len(ids) and ids[j] != end:
                    labels[j] = ids[j]
                    j += 1
                if j < len(ids):
                    labels[j] = ids[j]
                i = j
            i += 1
        batch.append((torch.tensor([ids]), torch.tensor([labels])))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)  # 5e-3 oscillated, 1e-3 is slow
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # measured: 0.2 s/step on one thread, 0.4-4 s on two on a busy 2-core box
    try:
        losses = [float("inf")] * len(batch)
        for step in range(max_steps):
            ids, labels = batch[step % len(batch)]
            loss = model(input_ids=ids, labels=labels).loss
            losses[step % len(batch)] = float(loss.detach())
            if max(losses) < target_loss:  # every conversation is learnt (it now samples them back)
                break
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        else:
            raise RuntimeError(f"teaching did not reach loss {target_loss} in {max_steps} steps: {losses}")
    finally:
        torch.set_num_threads(threads)
    model.eval()
    out_dir = Path(out_dir)
    shutil.copytree(base_dir, out_dir, dirs_exist_ok=True)
    model.save_pretrained(out_dir)
    return out_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def insurance_db_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agents.data.insurance_db import build_insurance_db

    return build_insurance_db(tmp_path_factory.mktemp("agent_sql") / "insurance.sqlite")


# tests/background.py: started when the session is collected, if a selected test needs the taught model. It builds its
# own tiny model (seed 0: the same files as ``tiny_model_dir``) and insurance database (the same rows), on one thread.
TEACH_IN_BACKGROUND = [sys.executable, "-m", "tests.deployments.agents_conftest_helpers", "{folder}"]


@pytest.fixture(scope="session")
def sql_model_dir(request: pytest.FixtureRequest) -> Path:
    """The tiny model taught SQL tool use, by the background process started when the session was collected."""
    teaching = started(request)
    code = teaching.wait()
    if code != 0:
        raise RuntimeError(f"teaching the SQL model in the background failed (exit {code}):\n"
                           f"{teaching.output()[-4000:]}")
    return teaching.folder / "taught"


@pytest.fixture(scope="session")
def agents_ray() -> Iterator[None]:
    """A local Ray cluster (reused if a session fixture elsewhere already started one)."""
    from tests.ray_head import session_cluster

    with session_cluster(Path(tempfile.mkdtemp(prefix="session_ray")), Path(__file__).resolve().parents[2]):
        yield


@pytest.fixture(scope="module")  # its only module; deleted after it (an idle app takes CPU from later tests)
def sql_rollout_app(agents_ray: None, sql_model_dir: Path) -> Iterator[dict[str, Any]]:
    """The real rollout app (RolloutServer + OpenAI ingress) serving the SQL-taught tiny model."""
    from ray import serve

    from deployments.rollout_app import RolloutAppArgs, build_app, ingress_handle, rollout_handle

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app_name = "agents-sql"
    args = RolloutAppArgs(model=str(sql_model_dir), engine="hf", parser="hermes", max_model_len=4096,
                          num_cpus=1, engine_kwargs={"max_batch_size": 64})
    serve.run(build_app(args), name=app_name, route_prefix="/agents-sql", blocking=False)
    yield {
        "rollout": rollout_handle(app_name),
        "ingress": ingress_handle(app_name),
        "base_url": f"http://127.0.0.1:{port}/agents-sql",
        "model_dir": sql_model_dir,
        "app_name": app_name,
    }
    try:
        serve.delete(app_name)
    except Exception:  # Serve (or Ray) was already shut down by another session fixture's teardown
        pass


if __name__ == "__main__":  # TEACH_IN_BACKGROUND: python -m tests.deployments.agents_conftest_helpers FOLDER
    from agents.data.insurance_db import build_insurance_db
    from apps.make_tiny_model import build_tiny_model

    folder = Path(sys.argv[1])
    base = build_tiny_model(folder / "base", seed=0)
    teach_sql_tool_use(base, folder / "taught", build_insurance_db(folder / "insurance.sqlite"))
