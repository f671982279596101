"""Publish → every rollout replica serving the new LoRA adapter: replicas on the learner's node vs on another node.

    python -m benchmarks.adapter_publish [--model tiny|smollm2|PATH] [--publishes 5] [--replicas 2]

Two Ray nodes on this machine (``ray.cluster_utils.Cluster``: a head and a second raylet, each with its own
object store). This process plays the train worker's rank 0 on the head: each publish saves nothing new (the
adapters are built first) but does everything a learner's publish does after ``save_adapter``: puts the folder's
files in the object store (``trainers.publisher.shareable``) and publishes the ref; it returns when every replica
has loaded the adapter and acknowledged it (``AdapterRegistry.publish``). Same adapters, same replica count, same
engine on both sides; only the replicas' node differs:

- same node: replicas on the head read the folder the learner wrote (``AdapterRef.node_id`` is theirs);
- other node: replicas on the second node fetch the files from the object store (a transfer between the two
  object stores), write them to a local folder and load that.

The adapters are the config's LoRA (``demo_cpu.yaml``: rank 8 on every linear layer) with random B weights.
Prints the median, min and max seconds per side and their ratio; there is no target to pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine_batching import model_folder


def build_adapters(model_dir: Path, out: Path, count: int) -> list[Path]:
    """``count`` adapters of the demo config's LoRA shape, each with different random B weights."""
    from configs import load_config
    from trainers.model import load_base_model

    cfg = load_config("configs/demo_cpu.yaml", [f"actor_rollout_ref.model.path={model_dir}"])
    model = load_base_model(cfg.actor_rollout_ref.model, lora=True)
    folders = []
    for version in range(1, count + 1):
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
        folder = out / f"v{version}"
        model.save_pretrained(str(folder))
        folders.append(folder)
    return folders


def publish_times(model_dir: Path, adapters: list[Path], node_resource: str, replicas: int) -> list[float]:
    """Deploy ``replicas`` replicas on the node with ``node_resource``, publish every adapter, time each publish."""
    from agents.records import AdapterRef
    from deployments.rollout_app import delete_rollout_app, deploy_rollout_app, publish_adapter
    from configs import load_config
    from trainers.publisher import shareable

    app = f"bench-publish-{node_resource}"
    cfg = load_config("configs/demo_cpu.yaml", [
        f"actor_rollout_ref.model.path={model_dir}", f"serve.app_name={app}", f"serve.min_replicas={replicas}",
        f"serve.max_replicas={replicas}", "serve.num_cpus_per_replica=0.5",
        f"serve.placement.resources={{{node_resource}: 1}}", "stream.partial_rollout=false",
    ])
    deploy_rollout_app(cfg)
    seconds = []
    try:
        for version, folder in enumerate(adapters, start=1):
            started = time.perf_counter()
            loaded = publish_adapter(app, shareable(AdapterRef(version, str(folder))), wait_s=300)
            seconds.append(time.perf_counter() - started)
            assert len(loaded) == replicas and set(loaded.values()) == {version}, loaded
    finally:
        delete_rollout_app(app)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (built here), smollm2 or a model folder")
    parser.add_argument("--publishes", type=int, default=10, help="adapters published per side")
    parser.add_argument("--replicas", type=int, default=2, help="rollout replicas per side")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    work = Path(tempfile.mkdtemp(prefix="bench-publish-"))
    model_dir = model_folder(args.model, str(work))
    adapters = build_adapters(model_dir, work / "adapters", args.publishes)
    size_mb = sum(f.stat().st_size for f in adapters[0].iterdir()) / 2**20
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"head_node": 8}})
    cluster.add_node(num_cpus=2, resources={"other_node": 8})
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        results = {side: publish_times(model_dir, adapters, resource, args.replicas)
                   for side, resource in (("same node (folder)", "head_node"), ("other node (object store)", "other_node"))}
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"\n{args.model}: adapter {size_mb:.2f} MB ({len(list(adapters[0].iterdir()))} files), {args.replicas} "
          f"replicas, {args.publishes} publishes per side; seconds from publish to every replica serving it")
    print(f"{'replicas':28s} {'median':>7s} {'min':>7s} {'max':>7s}")
    for side, seconds in results.items():
        print(f"{side:28s} {statistics.median(seconds):7.3f} {min(seconds):7.3f} {max(seconds):7.3f}")
    same, other = (statistics.median(s) for s in results.values())
    print(f"{args.model}: publish -> all replicas serving, other node / same node (median): {other / same:.2f}x "
          f"({other:.3f}s vs {same:.3f}s)")


if __name__ == "__main__":
    main()
