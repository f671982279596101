"""What a run needs from each node of the Ray cluster, checked before anything starts (orchestration layer).

A cluster of several nodes (KubeRay pods) shares no filesystem. Adapters travel through the object store
(``AdapterRef.files``); the rest must be true of every node a role can be placed on:

- checkpoints: ``trainer.storage_path`` must be a URI every node reaches once train workers may run on a node
  other than the driver's (Ray Train's ``storage_path`` rules);
- traces: agent workers write them to ``tracking.mlflow_tracking_uri``; a ``sqlite:///`` file or a folder is on
  the driver's disk, which agent workers on other nodes cannot reach (metrics are fine: the driver logs them);
- assets: ``model.path`` (and the tokenizer, the starting adapter) on the nodes of rollout replicas, train and
  agent workers, and each tool asset (``Tool.assets``: a row's SQLite database) on the nodes of agent workers,
  checked by a zero-CPU task pinned to each node.

Which nodes a role can use follows its placement keys (custom resources, node labels), as Ray would place it.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agents.data.rows import DatasetRow
from agents.records import AdapterRef
from agents.tools.base import Tool
from configs import TandemConfig
from configs.sections import Placement
from trainers.storage import checkpoint_root, is_uri, local_folder

log = logging.getLogger("tandem_rl.cluster")


class ClusterError(RuntimeError):
    """The run cannot work on this cluster as configured (raised before anything is deployed)."""


@dataclass(frozen=True)
class Node:
    """One alive Ray node: its id, address, resources and labels (``fits`` says whether a placement can land on it)."""

    node_id: str
    address: str
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.address} ({self.node_id[:12]})"

    def fits(self, placement: Placement, cpus: float = 0.0, gpus: float = 0.0) -> bool:
        """Whether Ray could place an actor with ``placement`` (and ``cpus``, ``gpus``) here."""
        asked = {"CPU": cpus, "GPU": gpus, **placement.resources}
        if any(self.resources.get(name, 0.0) < amount for name, amount in asked.items() if amount > 0):
            return False
        return all(_label_matches(self.labels.get(key), value) for key, value in placement.label_selector.items())


def _label_matches(value: str | None, selector: str) -> bool:
    """Ray's label selector values: ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``."""
    negate = selector.startswith("!")
    body = selector[1:] if negate else selector
    if body.startswith("in(") and body.endswith(")"):
        matches = value in {v.strip() for v in body[3:-1].split(",")}
    else:
        matches = value == body
    return matches != negate


def alive_nodes() -> list[Node]:
    """The alive nodes of the connected Ray cluster (``ray.nodes()``)."""
    return [Node(n["NodeID"], n["NodeManagerAddress"], dict(n.get("Resources") or {}), dict(n.get("Labels") or {}))
            for n in ray.nodes() if n["Alive"]]


@dataclass(frozen=True)
class Role:
    """One role of the run (agent workers, rollout replicas, train workers): the nodes it can land on and the files
    it reads there."""

    key: Literal["agents", "rollout", "trainer"]
    name: str  # what the error says: "rollout replicas (serve.placement)"
    nodes: list[Node]
    assets: dict[str, str]  # path -> the config keys or rows that name it


def named(*pairs: tuple[str | None, str]) -> dict[str, str]:
    """``{path: what names it}``; a path named twice keeps both names (no source silently wins)."""
    out: dict[str, str] = {}
    for path, source in pairs:
        if path:
            out[path] = f"{out[path]} and {source}" if path in out and source not in out[path] else source
    return out


def roles(cfg: TandemConfig, nodes: list[Node], rows: list[DatasetRow], tools: dict[str, Tool], *,
          deploy_rollout: bool, learner: bool) -> list[Role]:
    """Each role this run places, the nodes it can land on and the files it reads there."""
    from trainers.trainer import use_gpu

    model, rollout, trainer = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout, cfg.trainer
    tokenizer = (model.tokenizer_path or model.path,
                 "actor_rollout_ref.model.tokenizer_path" if model.tokenizer_path else "actor_rollout_ref.model.path")
    weights = [(model.path, "actor_rollout_ref.model.path"),
               (model.lora_adapter_path, "actor_rollout_ref.model.lora_adapter_path"), tokenizer]
    agent_files = named(tokenizer,
                        (rollout.multi_turn.tool_config_path, "actor_rollout_ref.rollout.multi_turn.tool_config_path"),
                        (cfg.tools.config_path, "tools.config_path"),
                        (cfg.custom_reward_function.path, "custom_reward_function.path"),
                        (cfg.reward.custom_reward_function.path, "reward.custom_reward_function.path"),
                        *tool_assets(tools, rows).items())
    found = [Role("agents", "agent workers (actor_rollout_ref.rollout.agent.placement)",
                  [n for n in nodes if n.fits(rollout.agent.placement)], agent_files)]
    if deploy_rollout:
        serve_cfg = cfg.serve
        found.append(Role("rollout", "rollout replicas (serve.placement)",
                          [n for n in nodes if n.fits(serve_cfg.placement, serve_cfg.num_cpus_per_replica,
                                                      serve_cfg.num_gpus_per_replica)], named(*weights)))
    if learner:
        gpu = use_gpu(trainer.device)
        resume = (trainer.resume_from_path, "trainer.resume_from_path") if trainer.resume_mode == "resume_path" \
            else (None, "")
        found.append(Role("trainer", "Ray Train workers (trainer.placement)",
                          [n for n in nodes if n.fits(trainer.placement, 0.0 if gpu else 1.0, 1.0 if gpu else 0.0)],
                          named(*weights, resume)))
    return found


def tool_assets(tools: dict[str, Tool], rows: list[DatasetRow]) -> dict[str, str]:
    """Every file the rows' episodes make the tools read → the first row (or the tool config) that names it."""
    assets: dict[str, str] = {}
    for name, tool in tools.items():
        for path in tool.assets({}):
            assets.setdefault(path, f"tool {name}'s config")
        for index, row in enumerate(rows):
            kwargs = dict(row.extra_info.tools_kwargs.get(name, {}).get("create_kwargs", {}) or {})
            if kwargs:
                for path in tool.assets(kwargs):
                    assets.setdefault(path, f"row {index} ({row.data_source}) tools_kwargs.{name}")
    return assets


def check_cluster(cfg: TandemConfig, rows: list[DatasetRow], tools: dict[str, Tool], *, deploy_rollout: bool,
                  learner: bool) -> list[Node]:
    """Raise ``ClusterError`` naming the key, node and path when the run cannot work on this cluster; return the
    alive nodes. Checkpoint storage and tracking first (no task needed), then the files on every node."""
    nodes = alive_nodes()
    driver = ray.get_runtime_context().get_node_id()
    placed = {role.key: role for role in roles(cfg, nodes, rows, tools, deploy_rollout=deploy_rollout,
                                                 learner=learner)}
    for role in placed.values():
        if not role.nodes:
            raise ClusterError(
                f"no alive node can take the {role.name}: none has its CPUs/GPUs, resources and labels. Nodes: "
                + ", ".join(f"{n} {n.resources} {n.labels}" for n in nodes)
                + ". (On an autoscaling cluster, keep at least one node of that kind running: minReplicas >= 1.)")
    if learner:
        _check_storage(cfg, driver, placed["trainer"].nodes)
    _check_tracking(cfg, driver, placed["agents"].nodes)
    with _storage_marker(cfg if learner else None) as marker:
        if marker:  # shared storage is seen by every train worker's node, or it is not shared
            placed["trainer"].assets[marker] = ("trainer.storage_path: a marker the driver just wrote there (a "
                                                "file:// URI must be storage every train worker's node shares)")
        _check_assets(list(placed.values()))
    return nodes


@contextlib.contextmanager
def _storage_marker(cfg: TandemConfig | None) -> Iterator[str | None]:
    """A file written into a ``file://`` checkpoint storage for the nodes to look for; removed afterwards."""
    root = checkpoint_root(cfg.trainer) if cfg is not None else ""
    folder = local_folder(root) if is_uri(root) else None
    if folder is None:
        yield None
        return
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f".tandem-shared-{uuid.uuid4().hex[:12]}"
    marker.write_text("written by the driver to check that every train worker's node sees this folder\n")
    try:
        yield str(marker)
    finally:
        marker.unlink(missing_ok=True)


def _check_storage(cfg: TandemConfig, driver: str, nodes: list[Node]) -> None:
    root = checkpoint_root(cfg.trainer)
    elsewhere = [n for n in nodes if n.node_id != driver]
    if is_uri(root) or not elsewhere:
        return
    raise ClusterError(
        f"trainer.storage_path: checkpoints would go to {root}, a folder on the driver's node, but Ray Train workers "
        f"may run on other nodes ({', '.join(map(str, elsewhere))}) that cannot reach it, and a resumed run would "
        "not find them. On a cluster of several nodes set trainer.storage_path to a URI every node reaches "
        "(s3://bucket/path, gs://bucket/path, or file:///mnt/shared/path on NFS), or pin the learner to this node "
        "with trainer.placement")


def _is_local_store(uri: str) -> bool:
    """A store only the driver's node reaches: a file (``sqlite:``, ``file:``, a folder) or a loopback server."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        return parsed.hostname in ("localhost", "127.0.0.1", "::1")
    return parsed.scheme in ("", "file", "sqlite") and uri != "databricks"


def _check_tracking(cfg: TandemConfig, driver: str, nodes: list[Node]) -> None:
    uri = cfg.tracking.mlflow_tracking_uri
    traced = cfg.actor_rollout_ref.rollout.trace.backend == "mlflow"
    elsewhere = [n for n in nodes if n.node_id != driver]
    if not traced or not elsewhere or not _is_local_store(uri):
        return
    raise ClusterError(
        f"tracking.mlflow_tracking_uri={uri} is a store only the driver's node reaches (a file on its disk or a "
        f"loopback address), but agent workers write their traces to it and may run on other nodes "
        f"({', '.join(map(str, elsewhere))}). Run an mlflow tracking server and set "
        "tracking.mlflow_tracking_uri=http://<host>:5000, or set actor_rollout_ref.rollout.trace.backend=none "
        "(metrics still reach mlflow: the driver logs them), or place agent workers on the driver's node "
        "(actor_rollout_ref.rollout.agent.placement)")


def _missing(paths: list[str]) -> list[tuple[str, str]]:
    """``(path, where it resolves here)`` of each path in ``paths`` that does not exist on this node."""
    return [(p, str(Path(p).resolve())) for p in paths if not Path(p).exists()]


def _check_assets(placed: list[Role]) -> None:
    wanted: dict[str, dict[str, str]] = {}  # node id -> path -> what names it
    nodes: dict[str, Node] = {}
    for role in placed:
        for node in role.nodes:
            nodes[node.node_id] = node
            for path, source in role.assets.items():
                if not is_uri(path):
                    wanted.setdefault(node.node_id, {}).setdefault(path, f"{source}, for the {role.name}")
    check = ray.remote(num_cpus=0)(_missing)
    pending = {node_id: check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
               .remote(sorted(paths)) for node_id, paths in wanted.items()}
    problems = []
    for node_id, ref in pending.items():
        try:
            missing = ray.get(ref, timeout=120)
        except Exception as exc:  # a fault boundary: a node that cannot run the check is named, not a raw Ray error
            raise ClusterError(f"could not check the run's files on node {nodes[node_id]}: {type(exc).__name__}: "
                               f"{exc}") from exc
        for path, resolved in missing:
            where = "" if resolved == path else f" (there: {resolved})"
            problems.append(f"  node {nodes[node_id]}: {path}{where} is missing ({wanted[node_id][path]})")
    if problems:
        # a hub id became the driver's hub-cache folder (deployments/model_paths.py): the other nodes need that cache too
        hub = any("/models--" in line for line in problems)
        raise ClusterError("files the run needs are missing on nodes that may use them:\n" + "\n".join(problems)
                           + "\nPut them on every such node (the image, a volume), or narrow the role's placement "
                           "keys to nodes that have them" + ("; a hub id resolves to the driver's hub cache "
                           "folder: give every node the same cache (HF_HOME on a shared volume, or the model baked "
                           "into the image at that path)" if hub else ""))


def on_this_node() -> dict[str, Any]:
    """Actor options that pin an actor to the node this process runs on."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def keep_copy(ref: AdapterRef) -> None:
    """Write the adapter's files to ``ref.path`` on this node when the learner wrote them on another node (no shared
    filesystem): the run dir on the driver's node then holds every published adapter, the final one included. An
    older folder at that path (an earlier run in the same run dir) is replaced."""
    if ref.files is None or not ref.node_id or ref.node_id == ray.get_runtime_context().get_node_id():
        return
    files: dict[str, bytes] = ray.get(ref.files)
    folder = Path(ref.path)
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name, data in files.items():
        (partial / Path(name).name).write_bytes(data)
    old = folder.with_name(f".{folder.name}.old")
    if folder.exists():
        shutil.rmtree(old, ignore_errors=True)
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
