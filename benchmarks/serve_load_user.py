"""The locust user of ``benchmarks.serve_load``: one simulated client running the demo task's multi-turn tool chat.

    locust -f benchmarks/serve_load_user.py --headless -u N -r N -t 180s --host http://127.0.0.1:PORT

Each task is one episode: an arithmetic question (``agents.data.arithmetic``, the demo's rows) with the
``calculator`` tool, sent through OpenAI's Python SDK with ``stream=True`` (the time to the first chunk is the TTFT)
and ``stream_options.include_usage`` (the output token count); a tool call is executed with the project's calculator
and the answer goes back as a ``tool`` message, at most 3 assistant turns. Every request is appended to
``LOAD_RECORDS`` (JSONL: start, TTFT, latency, output tokens, error kind) and reported to locust's statistics. The
run stops itself after ``LOAD_MAX_REQUESTS`` requests (locust's ``-t`` bounds the time).
"""

from __future__ import annotations

import itertools
import json
import os
import time

import openai
from locust import User, between, events, task

from agents.data import arithmetic
from benchmarks.chat_task import MAX_TURNS, TOOLS, calculator_answer

ROWS = arithmetic.make_rows(256, seed=7, split="val")
_requests = itertools.count(1)
_records = open(os.environ.get("LOAD_RECORDS", os.devnull), "a", buffering=1)


class ChatUser(User):
    """One client: episodes back to back, no think time (a closed loop, as an agent worker runs)."""

    wait_time = between(0, 0)

    def on_start(self) -> None:
        self.client = openai.OpenAI(base_url=f"{self.host}/v1", api_key=os.environ.get("LOAD_API_KEY", "none"),
                                    max_retries=0, timeout=float(os.environ.get("LOAD_TIMEOUT_S", "300")))
        self.model = os.environ["LOAD_MODEL"]
        self.rows = itertools.cycle(ROWS[hash(id(self)) % len(ROWS):] + ROWS)

    @task
    def episode(self) -> None:
        row = next(self.rows)
        messages = list(row["prompt"])
        for turn in range(MAX_TURNS):
            if next(_requests) > int(os.environ.get("LOAD_MAX_REQUESTS", "100000")):
                self.environment.runner.quit()
                return
            message = self._turn(messages, turn)
            if message is None or not message.get("tool_calls"):
                return
            messages.append(message)
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": calculator_answer(call["function"]["arguments"])})

    def _turn(self, messages: list[dict], turn: int) -> dict | None:
        started = time.perf_counter()
        first = None
        content, calls, tokens, error = [], {}, 0, ""
        try:
            stream = self.client.chat.completions.create(
                model=self.model, messages=messages, tools=TOOLS, max_tokens=96, temperature=1.0, stream=True,
                stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    delta = choice.delta
                    if first is None and (delta.content or delta.tool_calls):
                        first = time.perf_counter()
                    content.append(delta.content or "")
                    for call in delta.tool_calls or []:
                        entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                              "function": {"name": "", "arguments": ""}})
                        entry["id"] = call.id or entry["id"]
                        if call.function is not None:
                            entry["function"]["name"] += call.function.name or ""
                            entry["function"]["arguments"] += call.function.arguments or ""
        except openai.APIStatusError as exc:
            error = f"HTTP {exc.status_code}"
        except openai.APITimeoutError:
            error = "timeout"
        except openai.APIConnectionError as exc:
            error = f"connection: {type(exc.__cause__).__name__}"
        except Exception as exc:  # a malformed stream: counted, never hidden
            error = f"client: {type(exc).__name__}"
        latency = time.perf_counter() - started
        ttft = (first - started) if first is not None else latency
        _records.write(json.dumps({"start": started, "turn": turn, "ttft_s": ttft, "latency_s": latency,
                                   "output_tokens": tokens, "error": error}) + "\n")
        events.request.fire(request_type="chat", name=f"turn {turn + 1}", response_time=latency * 1000,
                            response_length=tokens, exception=RuntimeError(error) if error else None, context={})
        if error:
            return None
        message: dict = {"role": "assistant", "content": "".join(content)}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message
