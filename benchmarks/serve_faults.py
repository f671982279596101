"""Faults under load on the OpenAI endpoint: a rollout replica killed mid-load, and autoscaling 1 → 2 → 1.

    python -m benchmarks.serve_faults [--phases kill autoscale] [--clients 16] [--seconds 90] [--kill-at 30]
                                      (make bench-faults)

Both phases: ``ray start --head`` + ``serve deploy`` of serve_config.yaml on SmolLM2-135M-Instruct (as
``benchmarks.serve_load`` deploys it), a bearer token, and ``--clients`` asyncio clients on 127.0.0.1 running the
demo task's multi-turn calculator chat back to back: one ``x-session-id`` per episode, non-streaming, with
``return_token_ids``, every request under a client timeout (``--timeout``), ``--seconds`` of load and a request cap.

``kill``: ``RolloutServer`` at 2 replicas, one CPU each. At ``--kill-at`` seconds one replica's process gets
SIGKILL (its pid from the dashboard's Serve REST API). PASS when no request hangs past its timeout, every failed
request is a 503 in OpenAI's error shape (the requests in flight at the kill end 200, sent again to the other
replica, or 503), every session's record (``GET /v1/sessions/{id}``) holds exactly its completed requests' tokens
in order, and Serve brings the deployment back to 2 running replicas (the time is printed).

``autoscale``: 1 to 2 replicas with a short autoscaling config (``AUTOSCALE``). The clients run ``--seconds``, then
stop; the replica counts are read every second from the dashboard's Serve REST API (what the Serve page of the Ray
dashboard shows: running replicas and the autoscaler's target) until the deployment is back at 1. PASS when it
reached 2 running replicas under load and 1 after it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.chat_task import MAX_TURNS, TOOLS, calculator_answer
from benchmarks.serve_load import MODEL_NAME, ROOT, _percentile, tandem_app

GOAL = ("a replica killed mid-load: no hang, failures only OpenAI-shaped 503s, session records intact, 2 replicas "
        "again; autoscaling 1 -> 2 under load -> 1 after")
APP, DEPLOYMENT = "tandem-rollout", "RolloutServer"
RECOVERY_LIMIT_S = 300.0  # how long the kill phase waits for Serve to replace the killed replica
# upscale after 2 s above 4 requests per replica, downscale after 20 s below; queue lengths every second over 5 s
AUTOSCALE = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4, "upscale_delay_s": 2,
             "downscale_delay_s": 20, "metrics_interval_s": 1, "look_back_period_s": 5}


@dataclass
class Record:
    """One request: when it ran, how it ended, and (when it answered 200) the tokens the session must hold."""

    session: str
    turn: int
    start: float
    end: float = 0.0
    outcome: str = ""  # "200", "HTTP 503", "timeout", "connection: <exc>", "HTTP <n> not OpenAI-shaped"
    tokens: tuple[list[int], list[int]] | None = None  # (prompt_token_ids, token_ids) of a 200


@dataclass
class Load:
    records: list[Record] = field(default_factory=list)
    requests_left: int = 0


def _error_outcome(response: httpx.Response) -> str:
    """``HTTP <status>`` when the body is OpenAI's error object (``error.message``, ``error.type``), else says not."""
    try:
        error = response.json()["error"]
        ok = isinstance(error["message"], str) and isinstance(error["type"], str)
    except (ValueError, KeyError, TypeError):
        ok = False
    return f"HTTP {response.status_code}" + ("" if ok else " not OpenAI-shaped")


async def _request(http: httpx.AsyncClient, url: str, token: str, messages: list[dict], session: str, turn: int,
                   timeout_s: float, load: Load) -> dict | None:
    record = Record(session, turn, time.monotonic())
    load.records.append(record)
    body = {"model": MODEL_NAME, "messages": messages, "tools": TOOLS, "max_tokens": 64, "temperature": 1.0,
            "return_token_ids": True}
    headers = {"Authorization": f"Bearer {token}", "x-session-id": session}
    message = None
    try:
        response = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        record.outcome = "timeout"
    except httpx.HTTPError as exc:
        record.outcome = f"connection: {type(exc).__name__}"
    else:
        if response.status_code == 200:
            answer = response.json()
            record.outcome = "200"
            record.tokens = (answer["prompt_token_ids"], answer["choices"][0]["token_ids"])
            message = {k: v for k, v in answer["choices"][0]["message"].items() if k in ("role", "content",
                                                                                        "tool_calls")}
        else:
            record.outcome = _error_outcome(response)
    record.end = time.monotonic()
    return message


async def _client(http: httpx.AsyncClient, url: str, token: str, rows, deadline: float, timeout_s: float,
                  load: Load) -> None:
    """Episodes back to back until ``deadline`` (or the request cap): a tool call is answered with the calculator."""
    while time.monotonic() < deadline:
        messages, session = list(next(rows)["prompt"]), uuid.uuid4().hex
        for turn in range(MAX_TURNS):
            if load.requests_left <= 0 or time.monotonic() >= deadline:
                return
            load.requests_left -= 1
            message = await _request(http, url, token, messages, session, turn, timeout_s, load)
            if message is None or not message.get("tool_calls"):
                break
            messages.append(message)
            messages += [{"role": "tool", "tool_call_id": c["id"],
                          "content": calculator_answer(c["function"]["arguments"])} for c in message["tool_calls"]]


async def _progress(label: str, load: Load, started: float, seconds: float, every_s: float = 15.0) -> None:
    """One line every ``every_s`` while the load runs: how far, how many answered, failed and in flight."""
    while (elapsed := time.monotonic() - started) < seconds:
        await asyncio.sleep(min(every_s, seconds - elapsed))
        outcomes = Counter(r.outcome or "in flight" for r in load.records)
        print(f"{label}: {time.monotonic() - started:.0f}s of {seconds:.0f}s: {outcomes.pop('200', 0)} answered, "
              f"{outcomes.pop('in flight', 0)} in flight, other {dict(outcomes) or 0}", flush=True)


async def run_load(url: str, token: str, clients: int, seconds: float, timeout_s: float,
                   during=None, label: str = "load") -> list[Record]:
    """``clients`` clients for ``seconds``; ``during(started)`` runs beside them (a fault, a poller)."""
    from agents.data import arithmetic

    rows = itertools.cycle(arithmetic.make_rows(256, seed=11, split="val"))
    load = Load(requests_left=int(clients * seconds * 2))  # far above what the box answers: a cap, not a target
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits) as http:
        started = time.monotonic()
        deadline = started + seconds
        tasks = [asyncio.create_task(_client(http, url, token, rows, deadline, timeout_s, load))
                 for _ in range(clients)]
        if during is not None:
            tasks.append(asyncio.create_task(during(started)))
        tasks.append(asyncio.create_task(_progress(label, load, started, seconds)))
        await asyncio.gather(*tasks)
    return load.records


def _deployment(dashboard: str) -> dict:
    """The rollout deployment's details from the dashboard's Serve REST API (``/api/serve/applications/``)."""
    details = httpx.get(f"{dashboard}/api/serve/applications/", timeout=10).json()
    return details["applications"][APP]["deployments"][DEPLOYMENT]


def _running(deployment: dict) -> list[dict]:
    return [r for r in deployment["replicas"] if r["state"] == "RUNNING"]


def check_sessions(url: str, token: str, records: list[Record],
                   transport: httpx.BaseTransport | None = None) -> tuple[int, list[str]]:
    """Every session's record against its requests: the 200s' (prompt, answer) token ids, in order; a session with
    none has no record (404). Returns the number checked and what did not match."""
    by_session: dict[str, list[Record]] = {}
    for record in records:
        by_session.setdefault(record.session, []).append(record)
    broken = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=30, transport=transport) as http:
        for session, requests in by_session.items():
            expected = [list(map(list, r.tokens)) for r in sorted(requests, key=lambda r: r.turn) if r.tokens]
            response = http.get(f"{url}/v1/sessions/{session}")
            if not expected:
                if response.status_code != 404:
                    broken.append(f"{session}: no request answered, but the record answers {response.status_code}")
                continue
            if response.status_code != 200:
                broken.append(f"{session}: {len(expected)} answered, the record answers {response.status_code}")
                continue
            held = [[c["prompt_ids"], c["response_ids"]] for c in response.json()["calls"]]
            if held != expected:
                broken.append(f"{session}: {len(expected)} answered, the record holds {len(held)} calls that differ")
    return len(by_session), broken


def _summary(records: list[Record], seconds: float) -> str:
    outcomes = Counter(r.outcome for r in records)
    latencies = [r.end - r.start for r in records if r.outcome == "200"]
    p99 = _percentile(latencies, 0.99)
    return (f"{len(records)} requests ({len(records) / seconds:.2f}/s), outcomes {dict(outcomes)}, "
            f"latency max {max(latencies, default=float('nan')):.1f}s p99 {p99:.1f}s")


def phase_kill(model: Path, token: str, out: Path, args: argparse.Namespace) -> bool:
    killed: dict = {}

    async def kill(started: float) -> None:
        try:
            await _kill(started)
        except Exception as exc:  # the fault itself failed: the phase says so instead of ending in a traceback
            killed["error"] = f"{type(exc).__name__}: {exc}"

    async def _kill(started: float) -> None:
        await asyncio.sleep(args.kill_at)
        running = _running(await asyncio.to_thread(_deployment, head.dashboard))
        if not running:
            raise RuntimeError("no running RolloutServer replica to kill")
        replica = running[0]
        os.kill(replica["pid"], signal.SIGKILL)
        killed.update(at=time.monotonic(), started=started, replica=replica["replica_id"], pid=replica["pid"])
        # back: two running replicas, the killed one not among them (Serve lists it as running until its health
        # check fails)
        while time.monotonic() < killed["at"] + RECOVERY_LIMIT_S:
            running = _running(await asyncio.to_thread(_deployment, head.dashboard))
            if len(running) == 2 and replica["replica_id"] not in {r["replica_id"] for r in running}:
                killed["back"] = time.monotonic()
                return
            await asyncio.sleep(1)

    fixed = {"min_replicas": 2, "max_replicas": 2}
    with tandem_app(model, token, out, "float32", fixed, replica_cpus=1, max_ongoing=args.clients) as (url, head):
        records = asyncio.run(run_load(url, token, args.clients, args.seconds, args.timeout, during=kill, label="kill"))
        checked, broken = check_sessions(url, token, records)
    if "at" not in killed:
        print(f"kill: FAIL (the replica was not killed: {killed.get('error', 'the load ended first')})", flush=True)
        return False
    at = killed["at"]
    in_flight = [r for r in records if r.start < at < r.end]
    back = f"after {killed['back'] - at:.1f}s" if "back" in killed else f"not within {RECOVERY_LIMIT_S:.0f}s"
    print(f"kill: SIGKILL to replica {killed['replica']} (pid {killed['pid']}) at "
          f"{at - killed['started']:.1f}s; 2 replicas running again {back}", flush=True)
    print(f"kill: {_summary(records, args.seconds)}")
    print(f"kill: in flight at the kill: {len(in_flight)}, ended {dict(Counter(r.outcome for r in in_flight))}")
    turns = Counter(r.session for r in records)
    print(f"kill: sessions checked {checked} ({sum(n > 1 for n in turns.values())} of more than one request), records "
          f"not matching their answered requests: {len(broken)}")
    for line in broken[:10]:
        print(f"  {line}")
    failed = [r.outcome for r in records if r.outcome not in ("200", "HTTP 503")]
    ok = not failed and not broken and "back" in killed and any(r.outcome == "200" for r in records if r.start > at)
    print(f"kill: {'PASS' if ok else 'FAIL'} (requests neither 200 nor an OpenAI-shaped 503: {len(failed)} "
          f"{dict(Counter(failed)) or ''}; broken session records: {len(broken)}; answers after the kill: "
          f"{sum(r.outcome == '200' for r in records if r.start > at)}; replaced: {'back' in killed})", flush=True)
    return ok


def phase_autoscale(model: Path, token: str, out: Path, args: argparse.Namespace) -> bool:
    timeline: list[tuple[float, int, int]] = []  # (seconds since the load started, running, target)

    async def poll(started: float) -> None:
        while time.monotonic() < started + args.seconds:
            deployment = await asyncio.to_thread(_deployment, head.dashboard)
            timeline.append((time.monotonic() - started, len(_running(deployment)), deployment["target_num_replicas"]))
            await asyncio.sleep(1)

    with tandem_app(model, token, out, "float32", AUTOSCALE, replica_cpus=1, max_ongoing=args.clients) as (url, head):
        started = time.monotonic()
        records = asyncio.run(run_load(url, token, args.clients, args.seconds, args.timeout, during=poll,
                                          label="autoscale"))
        load_end = max([r.end for r in records] + [started + args.seconds])
        while time.monotonic() < load_end + args.settle:
            deployment = _deployment(head.dashboard)
            timeline.append((time.monotonic() - started, len(_running(deployment)), deployment["target_num_replicas"]))
            if timeline[-1][1:] == (1, 1):
                break
            time.sleep(1)
    up = next((t for t, running, _ in timeline if running == 2), None)
    target_up = next((t for t, _, target in timeline if target == 2), None)
    down = next((t for t, running, target in timeline if t > load_end - started and (running, target) == (1, 1)), None)
    print(f"autoscale: {_summary(records, args.seconds)}")
    print(f"autoscale: target 2 at {target_up if target_up is None else f'{target_up:.0f}s'}, 2 running at "
          f"{up if up is None else f'{up:.0f}s'} after the load started; load ended at {load_end - started:.0f}s; "
          f"back to 1 at {down if down is None else f'{down:.0f}s'}")
    changes = [point for i, point in enumerate(timeline) if i == 0 or point[1:] != timeline[i - 1][1:]]
    print("autoscale: (s, running, target) at each change: " + ", ".join(f"({t:.0f}, {r}, {g})" for t, r, g in changes))
    failed = [r.outcome for r in records if r.outcome != "200"]
    ok = up is not None and down is not None and not failed
    print(f"autoscale: {'PASS' if ok else 'FAIL'} (reached 2 running replicas under load: {up is not None}; back to 1 "
          f"within {args.settle:.0f}s after it: {down is not None}; requests not answered: {len(failed)})", flush=True)
    return ok


PHASES = {"kill": phase_kill, "autoscale": phase_autoscale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", nargs="+", choices=sorted(PHASES), default=["kill", "autoscale"])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=90.0, help="load per phase")
    parser.add_argument("--kill-at", type=float, default=30.0, help="seconds into the kill phase's load")
    parser.add_argument("--timeout", type=float, default=120.0, help="each request's client timeout (a hang)")
    parser.add_argument("--settle", type=float, default=150.0, help="autoscale: how long to wait for 1 replica after")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "serve-faults")
    args = parser.parse_args(argv)
    if args.kill_at >= args.seconds:
        parser.error(f"--kill-at {args.kill_at} must fall inside the load's --seconds {args.seconds}")
    from apps.prepare_model import prepare_model

    model = prepare_model("smollm2-135m", args.model).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    results = {phase: PHASES[phase](model, token, args.out, args) for phase in args.phases}
    verdicts = ", ".join(f"{phase} {'PASS' if ok else 'FAIL'}" for phase, ok in results.items())
    print(f"serve_faults: {'PASS' if all(results.values()) else 'FAIL'} ({verdicts})")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
