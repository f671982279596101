"""Do follow-up prompts through the OpenAI endpoint extend the session token for token?

    python -m benchmarks.session_drift [--model DIR] [--sessions 30]

An agent framework sends the whole conversation back on each call. This drives ``--sessions`` three-call sessions
through ``/v1/chat/completions`` with ``x-session-id`` (the demo's arithmetic questions, the calculator tool run for
real on each call the model makes, then a follow-up question) against the demo's SFT model, served by the rollout
app on a local Ray cluster (prepared as ``make demo`` prepares it, cached). For each follow-up call it checks
whether the recorded prompt starts with the previous call's prompt + sampled ids (a token-exact extension, merged
into one training sample) — once as served (the ingress replays recorded answers: ``deployments/session_replay``)
and once for the same conversations rendered by the chat template alone. Goal: every follow-up extends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

GOAL = "every follow-up prompt extends the previous prompt + answer"
APP = "session-drift"
FOLLOW_UP = "Thanks. What is that result plus 1?"


def _prepare(config: str) -> Path:
    from apps import demo
    from configs import load_config

    cfg = load_config(config, [])
    demo.prepare_base_model(Path(cfg.sft.base_model))
    demo.cold_start(cfg, demo.write_data(cfg, cfg.trainer.seed))
    return Path(cfg.sft.output_dir).resolve()


def _questions(config: str, count: int) -> list[str]:
    from agents.data.rows import load_rows
    from configs import load_config

    cfg = load_config(config, [])
    rows = [row for path in cfg.data.val_paths for row in load_rows(path)]
    return [next(m.content for m in row.prompt if m.role == "user") for row in rows[:count]]


def _run_tools(message: dict) -> list[dict]:
    """The calculator, for real, on each call of an assistant message."""
    from agents.tools.calculator import calculate, format_number

    results = []
    for call in message.get("tool_calls") or []:
        try:
            expression = json.loads(call["function"]["arguments"]).get("expression", "")
            content = format_number(calculate(str(expression)))
        except Exception as exc:  # noqa: BLE001 - the model's bad call gets the error text, as in training
            content = f"error: {exc}"
        results.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return results


async def _session(client, session_id: str, question: str, tools: list[dict]) -> list[list[dict]]:
    """Three calls; returns the messages each call sent."""
    messages: list[dict] = [{"role": "user", "content": question}]
    sent = []
    for turn in range(3):
        sent.append(list(messages))
        reply = await client.chat.completions.create(model="sft", messages=messages, tools=tools, temperature=1.0,
                                                     max_tokens=96, seed=turn, extra_headers={"x-session-id": session_id})
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        tool_messages = _run_tools(message)
        messages += tool_messages or [{"role": "user", "content": FOLLOW_UP}]
    return sent


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _extends(previous, call) -> bool:
    head = tuple(previous.prompt_ids) + tuple(previous.response_ids)
    return tuple(call.prompt_ids[:len(head)]) == head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("--model", default=None, help="model folder (default: the demo's SFT model, prepared)")
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=6)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = Path(args.model).resolve() if args.model else _prepare(args.config)
    questions = _questions(args.config, args.sessions)

    import openai
    import ray
    from ray import serve
    from transformers import AutoTokenizer

    from agents.tools.calculator import CalculatorTool
    from deployments.rollout_app import RolloutAppArgs, build_app, ingress_handle

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_config=ray.LoggingConfig(log_level="WARNING"))
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(RolloutAppArgs(model=str(model), parser="qwen25_coder", max_model_len=2048, num_cpus=1.0)),
              name=APP, route_prefix="/")
    tools = [CalculatorTool.default_schema()]
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
    slots = asyncio.Semaphore(args.concurrency)

    async def one(i: int, question: str) -> list[list[dict]]:
        async with slots:
            return await _session(client, f"drift-{i}", question, tools)

    async def everything() -> list[list[list[dict]]]:
        return await asyncio.gather(*(one(i, q) for i, q in enumerate(questions)))

    started = time.perf_counter()
    conversations = asyncio.run(everything())
    tokenizer = AutoTokenizer.from_pretrained(model)
    ingress = ingress_handle(APP)
    served = plain = total = calls_with_tools = 0
    for i, sent in enumerate(conversations):
        calls = ingress.pop_session.remote(f"drift-{i}").result()
        if len(calls) != len(sent):
            raise RuntimeError(f"session drift-{i}: {len(calls)} recorded calls for {len(sent)} requests")
        for k in range(1, len(calls)):
            total += 1
            served += _extends(calls[k - 1], calls[k])
            rendered = tokenizer.apply_chat_template(sent[k], tools=tools, add_generation_prompt=True,
                                                     return_dict=False)
            plain += _extends(calls[k - 1], type(calls[k])(tuple(rendered), (), (), 0, "stop"))
            calls_with_tools += any(m.get("tool_calls") for m in sent[k] if m.get("role") == "assistant")
    serve.delete(APP)
    ray.shutdown()
    print(f"{len(conversations)} sessions x 3 calls in {time.perf_counter() - started:.0f}s; {calls_with_tools} of "
          f"{total} follow-ups send back an answer with tool calls")
    ok = served == total
    print(f"follow-ups that extend: served {served}/{total}, chat template alone {plain}/{total} "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
