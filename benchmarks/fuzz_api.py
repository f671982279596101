"""Hostile input against the OpenAI ingress, generated from the app's own OpenAPI schema (schemathesis + hypothesis).

    python -m benchmarks.fuzz_api [--requests 2000] [--seed N] [--time-limit 1200]      (make fuzz-api)

Deploys the rollout app on the tiny model (a local Ray cluster, Serve on 127.0.0.1, a bearer token), then sends
``--requests`` requests spread over every route of the schema: bodies, headers (``x-session-id``,
``authorization``) and path parameters drawn by schemathesis, most with the right token so they reach the handlers,
one in eight with the generated ``authorization`` header (wrong or missing: a 401). Every answer is checked:
no 5xx, and the body conforms to the schema of its status (errors: OpenAI's ``{"error": {...}}``). Before and after,
a valid session is recorded and read back: the server must still answer, and that session's record must be
byte-identical. Traffic goes to 127.0.0.1 only, with a bounded count and a time limit. The last line is the verdict.

``tests/deployments/test_fuzz_api.py`` runs ``fuzz`` with a fixed seed and a few hundred requests against the
test suite's shared app.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

GOAL = "0 answers 5xx, 0 answers off the schema, healthy after, a valid session's record untouched"
PROBE_MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


@dataclass
class FuzzReport:
    """What one fuzz run sent and found."""

    requests: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_route: Counter = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    schema_errors: list[str] = field(default_factory=list)
    transport_errors: list[str] = field(default_factory=list)
    healthy_after: bool = False
    session_intact: bool = False
    seconds: float = 0.0
    stopped_by_time: bool = False

    @property
    def ok(self) -> bool:
        return (not self.server_errors and not self.schema_errors and not self.transport_errors
                and self.healthy_after and self.session_intact)

    def summary(self) -> str:
        statuses = ", ".join(f"{code}: {n}" for code, n in sorted(self.by_status.items()))
        routes = ", ".join(f"{route} {n}" for route, n in sorted(self.by_route.items()))
        return (f"{self.requests} requests in {self.seconds:.0f}s{' (time limit reached)' if self.stopped_by_time else ''}"
                f"; by status {statuses}; by route {routes}; 5xx {len(self.server_errors)}, off-schema "
                f"{len(self.schema_errors)}, transport errors {len(self.transport_errors)}; healthy after: "
                f"{self.healthy_after}; probe session intact: {self.session_intact}")


def _probe_session(root: str, token: str, session_id: str) -> bytes | None:
    """Record one valid call under ``session_id`` (if not yet) and return its record as read back."""
    auth = {"Authorization": f"Bearer {token}"}
    response = httpx.get(f"{root}/v1/sessions/{session_id}", headers=auth, timeout=60)
    if response.status_code == 404:
        body = {"messages": PROBE_MESSAGES, "max_tokens": 4, "temperature": 0, "seed": 0}
        httpx.post(f"{root}/v1/chat/completions", json=body, headers={**auth, "x-session-id": session_id},
                   timeout=120).raise_for_status()
        response = httpx.get(f"{root}/v1/sessions/{session_id}", headers=auth, timeout=60)
    return response.content if response.status_code == 200 else None


def fuzz(root: str, token: str, *, requests: int, seed: int, time_limit_s: float,
         schema: dict[str, Any] | None = None) -> FuzzReport:
    """Send ``requests`` generated requests to the app at ``root`` (``http://127.0.0.1:<port>``), checking each."""
    import requests as requests_lib
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    if schema is None:
        from deployments.openai_ingress import app

        schema = app.openapi()
    loaded = schemathesis.openapi.from_dict(schema)
    operations = [result.ok() for result in loaded.get_all_operations()]
    report = FuzzReport()
    probe_id = f"fuzz-probe-{secrets.token_hex(8)}"
    before = _probe_session(root, token, probe_id)
    started = time.monotonic()
    http = requests_lib.Session()
    def sender(operation):  # hypothesis refuses @given on a function with default arguments
        def send(case) -> None:
            if report.requests >= requests or time.monotonic() - started > time_limit_s:
                report.stopped_by_time = report.requests < requests
                return
            report.requests += 1
            report.by_route[operation.label] += 1
            # most requests carry the token, so they reach the handlers; every eighth keeps the generated header
            headers = None if report.requests % 8 == 0 else {"authorization": f"Bearer {token}"}
            where = f"{operation.label} body={json.dumps(case.body, default=str)[:300]} headers={case.headers}"
            try:
                response = case.call(base_url=root, session=http, headers=headers, timeout=120)
            except (requests_lib.RequestException, TimeoutError) as exc:  # a reset connection, a hang past the timeout
                report.transport_errors.append(f"{where}: {exc!r}")
                return
            report.by_status[response.status_code] += 1
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except BaseExceptionGroup as exc:  # a failed check (schemathesis' FailureGroup): recorded, and on we go
                report.server_errors.append(f"{where}: {response.status_code} {response.text[:300]}: {exc}")
            try:
                case.validate_response(response, checks=[response_schema_conformance])
            except BaseExceptionGroup as exc:
                report.schema_errors.append(f"{where}: {response.status_code} {response.text[:300]}: {exc}")
        return send

    # rounds over the routes: a route whose inputs hypothesis has exhausted (GET /v1/models has one header) leaves its
    # share to the others, so the run sends `requests` in all unless every route runs dry or time runs out
    productive = list(range(len(operations)))
    rounds = 0
    while productive and report.requests < requests and time.monotonic() - started <= time_limit_s:
        share = max(1, (requests - report.requests) // len(productive))
        for index in list(productive):
            before_count = report.requests
            run = given(operations[index].as_strategy())(sender(operations[index]))
            run = settings(max_examples=share, database=None, deadline=None, derandomize=False,
                           suppress_health_check=list(HealthCheck))(run)
            hypothesis_seed(seed + 1000 * rounds + index)(run)()
            if report.requests - before_count < share:
                productive.remove(index)
        rounds += 1
    report.seconds = time.monotonic() - started
    try:
        report.healthy_after = all(httpx.get(f"{root}{path}", headers={"Authorization": f"Bearer {token}"},
                                             timeout=60).status_code == 200 for path in ("/health", "/v1/models"))
        report.session_intact = before is not None and _probe_session(root, token, probe_id) == before
    except httpx.HTTPError:
        report.healthy_after = False
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None, help="default: a new one each run (printed, to replay it)")
    parser.add_argument("--time-limit", type=float, default=1200.0, help="seconds of fuzzing at most")
    parser.add_argument("--model", type=Path, default=Path(".cache/tiny-model"))
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    import os

    import ray
    from ray import serve

    from apps.make_tiny_model import build_tiny_model
    from deployments.rollout_app import RolloutAppArgs, build_app
    from tests.ray_head import free_port

    if not (args.model / "config.json").is_file():
        build_tiny_model(args.model, seed=0)
    token = secrets.token_hex(16)
    os.environ["TANDEM_FUZZ_API_KEY"] = token
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config={"log_level": "WARNING"})
    serve.run(build_app(RolloutAppArgs(model=str(args.model.resolve()), parser="qwen25_coder", max_model_len=512,
                                       min_replicas=1, max_replicas=1, num_cpus=1,
                                       api_key_env="TANDEM_FUZZ_API_KEY")), name="tandem-fuzz", route_prefix="/")
    try:
        print(f"fuzzing http://127.0.0.1:{port} with seed {seed}: {args.requests} requests, at most "
              f"{args.time_limit:.0f}s", flush=True)
        report = fuzz(f"http://127.0.0.1:{port}", token, requests=args.requests, seed=seed,
                      time_limit_s=args.time_limit)
    finally:
        serve.shutdown()
        ray.shutdown()
    for kind, found in (("5xx", report.server_errors), ("off-schema", report.schema_errors),
                        ("transport", report.transport_errors)):
        for line in found[:20]:
            print(f"{kind}: {line}")
    print(f"fuzz-api: {report.summary()}; seed {seed}; {'PASS' if report.ok else 'FAIL'} ({GOAL})")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
