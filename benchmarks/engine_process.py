"""An ``HFEngine`` in its own process, as a rollout replica is in a real run (benchmarks' plumbing).

In a real run the agent loops (agent worker actors) and the engine (a ``RolloutServer`` replica) are separate
processes, so the agents' Python (chat-template deltas, parsing, tool calls) runs beside the engine's steps, not
inside the same interpreter taking turns at one GIL with them. Benchmarks that put the two in one process measure that
contention as scheduling. ``EngineProcess`` keeps the engine's own calls (``generate``, ``load_adapter``, ``stats``)
as awaitables over two pipes, without Ray, so only the scheduling differs between a benchmark's modes.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle
import threading
from pathlib import Path
from typing import Any, Sequence

from agents.records import AdapterRef, SamplingParams
from deployments.engines.base import EngineOutput


def _serve(model_dir: str, num_threads: int, engine_kwargs: dict[str, Any], requests: Any, replies: Any) -> None:
    """The engine process: answers ``(key, kind, args)`` messages, kind one of generate, load, stats, cancel;
    ``None`` ends it. Each reply is ``(key, ok, payload)``: a result, or the exception the call raised, pickled apart
    from the key, so a reply the caller's side cannot read fails that one call and no other."""
    import torch

    from deployments.engines.hf_engine import HFEngine

    torch.set_num_threads(num_threads)
    engine = HFEngine(model_dir, **engine_kwargs)

    async def answer(key: str, kind: str, args: tuple) -> None:
        try:
            if kind == "load":
                value = await engine.load_adapter(AdapterRef(version=args[0], path=args[1]))
            elif kind == "stats":
                value = engine.stats
            else:
                value = await engine.generate(args[0], args[1], key)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # fault boundary: the caller gets the error, the engine keeps serving
            try:
                payload = pickle.dumps(error)
                pickle.loads(payload)
            except Exception:  # an error that cannot cross the pipe still reaches its caller, by type and message
                payload = pickle.dumps(RuntimeError(f"{type(error).__name__}: {error}"))
            replies.send((key, False, payload))
        else:
            replies.send((key, True, pickle.dumps(value)))

    async def loop() -> None:
        tasks: dict[str, asyncio.Task] = {}
        while (message := await asyncio.to_thread(requests.recv)) is not None:
            key, kind, _ = message
            if kind == "cancel":  # the caller gave up: the engine frees the row
                if key in tasks:
                    tasks[key].cancel()
                continue
            tasks[key] = asyncio.create_task(answer(*message))
            tasks[key].add_done_callback(lambda task, key=key: tasks.pop(key) if tasks.get(key) is task else None)
        for task in tasks.values():  # generations still running when the benchmark ended: nobody awaits them
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await engine.close()

    asyncio.run(loop())


class EngineProcess:
    """The caller's side of ``_serve``: ``HFEngine``'s calls as awaitables; replies are read by a thread and handed
    to the event loop that made each call. ``engine_kwargs`` are ``HFEngine``'s (``max_model_len`` at least)."""

    def __init__(self, model_dir: Path | str, *, num_threads: int = 1, **engine_kwargs: Any):
        ctx = mp.get_context("spawn")
        child_requests, self._requests = ctx.Pipe(duplex=False)
        self._replies, child_replies = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_serve, daemon=True,
                                    args=(str(model_dir), num_threads, engine_kwargs, child_requests, child_replies))
        self._process.start()
        self._pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._send_lock = threading.Lock()
        self._keys = 0
        threading.Thread(target=self._read, daemon=True, name="engine-process-replies").start()

    def _read(self) -> None:
        while True:
            try:
                key, ok, payload = self._replies.recv()
            except (EOFError, OSError):  # the engine process is gone: no pending call will be answered
                self._process.join(timeout=1)
                gone = RuntimeError(f"the engine process exited (exit code {self._process.exitcode})")
                for key in list(self._pending):
                    self._hand_over(key, False, gone)
                return
            try:
                value = pickle.loads(payload)
            except Exception as error:  # e.g. a class this process cannot import: that caller learns why
                ok, value = False, RuntimeError(f"the engine's reply to {key!r} could not be read here: "
                                                f"{type(error).__name__}: {error}")
            self._hand_over(key, ok, value)

    def _hand_over(self, key: str, ok: bool, value: Any) -> None:
        loop, future = self._pending.pop(key, (None, None))
        if future is None:
            return
        try:
            loop.call_soon_threadsafe(_settle, future, ok, value)
        except RuntimeError:  # that event loop has closed: nobody awaits the reply
            pass

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self._requests.send(message)

    async def call(self, kind: str, *args: Any, key: str | None = None) -> Any:
        if key is None:
            self._keys += 1
            key = f"{kind}-{self._keys}"
        if key in self._pending:
            raise ValueError(f"request {key!r} is already in flight in the engine process")
        future = asyncio.get_running_loop().create_future()
        self._pending[key] = (asyncio.get_running_loop(), future)
        try:
            self._send((key, kind, args))
        except BaseException:
            self._pending.pop(key, None)
            raise
        try:
            return await future
        except asyncio.CancelledError:
            self._pending.pop(key, None)
            try:
                self._send((key, "cancel", ()))
            except OSError:  # the engine process is gone: nothing to cancel
                pass
            raise

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, request_id: str) -> EngineOutput:
        return await self.call("generate", tuple(prompt_ids), sampling, key=request_id)

    async def load_adapter(self, ref: AdapterRef) -> None:
        await self.call("load", ref.version, ref.path)

    async def stats(self) -> dict[str, float]:
        return await self.call("stats")

    def close(self) -> None:
        try:
            self._send(None)
        except OSError:  # it has exited already
            pass
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
