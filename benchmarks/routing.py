"""Sticky least-loaded routing, measured: N concurrent trajectories x T turns over the replicas.

    python -m benchmarks.routing [--trajectories 64] [--turns 3] [--replicas 2]

Starts a local Ray cluster, deploys the rollout app on a freshly built tiny model and prints:
the share of trajectories whose turns all hit one replica, trajectories and requests per replica, and the
max/min ratio of each replica's time-averaged in-flight requests (from the client-side request intervals).
``measure_routing`` is also what ``tests/deployments/test_routing.py`` asserts on.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from agents.records import GenerateRequest, SamplingParams


@dataclass(frozen=True)
class Call:
    trajectory_id: str
    turn: int
    replica_id: str
    start_s: float
    end_s: float


async def _trajectory(
    handle: Any, trajectory_id: str, prompt_ids: Sequence[int], turns: int, max_new_tokens: int, seed: int
) -> list[Call]:
    ids = tuple(prompt_ids)
    user_turn = tuple(prompt_ids[-3:])  # stands in for a tool message appended between turns
    calls = []
    for turn in range(turns):
        request = GenerateRequest(
            prompt_ids=ids,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed * 100 + turn),
            trajectory_id=trajectory_id,
            request_id=f"{trajectory_id}-turn{turn}",
        )
        start = time.monotonic()
        result = await handle.generate.remote(request)
        calls.append(Call(trajectory_id, turn, result.replica_id, start, time.monotonic()))
        ids = ids + result.token_ids + user_turn
    return calls


def summarize(calls: Sequence[Call], num_replicas: int) -> dict[str, Any]:
    """Stickiness share, per-replica counts and the max/min ratio of time-averaged in-flight requests.

    A replica that got no trajectory makes both ratios infinite.
    """
    replicas_of: dict[str, set[str]] = defaultdict(set)
    for call in calls:
        replicas_of[call.trajectory_id].add(call.replica_id)
    first_replica = Counter(min(calls_of, key=lambda c: c.turn).replica_id for calls_of in _by_trajectory(calls))
    window = max(c.end_s for c in calls) - min(c.start_s for c in calls)
    busy: Counter[str] = Counter()
    for call in calls:
        busy[call.replica_id] += call.end_s - call.start_s
    mean_in_flight = {r: busy[r] / window for r in busy}
    unused = len(first_replica) < num_replicas
    return {
        "trajectories": len(replicas_of),
        "requests": len(calls),
        "sticky_share": sum(len(r) == 1 for r in replicas_of.values()) / len(replicas_of),
        "trajectories_per_replica": dict(first_replica),
        "requests_per_replica": dict(Counter(c.replica_id for c in calls)),
        "mean_in_flight_per_replica": mean_in_flight,
        "in_flight_max_min_ratio": math.inf if unused else max(mean_in_flight.values()) / min(mean_in_flight.values()),
        "trajectory_split_ratio": math.inf if unused else max(first_replica.values()) / min(first_replica.values()),
    }


def _by_trajectory(calls: Sequence[Call]) -> list[list[Call]]:
    grouped: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        grouped[call.trajectory_id].append(call)
    return list(grouped.values())


async def measure_routing(
    handle: Any,
    prompt_ids: Sequence[int],
    num_replicas: int,
    trajectories: int = 64,
    turns: int = 3,
    max_new_tokens: int = 8,
    tag: str = "bench",
) -> dict[str, Any]:
    """Run the trajectories concurrently through ``handle`` and summarize where their turns went."""
    runs = [
        _trajectory(handle, f"{tag}-{i}", prompt_ids, turns, max_new_tokens, seed=i) for i in range(trajectories)
    ]
    calls = [call for run in await asyncio.gather(*runs) for call in run]
    return summarize(calls, num_replicas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args()

    import os

    import ray
    from ray import serve
    from transformers import AutoTokenizer

    from apps.make_tiny_model import build_tiny_model
    from deployments.rollout_app import RolloutAppArgs, build_app, rollout_handle

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(tmp, seed=0)
        prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
            [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True, return_dict=False
        )
        ray.init(address="local", num_cpus=max(4, args.replicas + 1), include_dashboard=False, log_to_driver=False)
        try:
            app_args = RolloutAppArgs(
                model=str(model_dir), max_model_len=1024, min_replicas=args.replicas,
                max_replicas=args.replicas, num_cpus=0.5,
            )
            serve.run(build_app(app_args), name="routing-bench", route_prefix=None)
            stats = asyncio.run(
                measure_routing(rollout_handle("routing-bench"), prompt, args.replicas, args.trajectories,
                                args.turns, args.max_new_tokens)
            )
        finally:
            serve.shutdown()
            ray.shutdown()
    print(f"routing: {stats['trajectories']} trajectories x {args.turns} turns on {args.replicas} replicas")
    print(f"sticky share (all turns on one replica): {stats['sticky_share']:.3f}")
    print(f"trajectories per replica: {sorted(stats['trajectories_per_replica'].values())}")
    print(f"requests per replica: {sorted(stats['requests_per_replica'].values())}")
    mean = sorted(round(v, 2) for v in stats["mean_in_flight_per_replica"].values())
    print(f"time-averaged in-flight per replica: {mean}")
    print(f"max/min in-flight ratio: {stats['in_flight_max_min_ratio']:.2f}x (sticky share {stats['sticky_share']:.3f})")


if __name__ == "__main__":
    main()
