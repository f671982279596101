"""``benchmarks.engine_process``: the benchmarks' engine in its own process answers as the in-process engine does,
reports a bad request's error to its caller and keeps serving, frees the row of a call its caller cancelled, loads
adapters over the pipe, and fails a reply it cannot read for that caller alone. Every wait is bounded, so a lost reply
fails the test instead of hanging it."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import pickle
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from agents.records import AdapterRef, SamplingParams
from benchmarks.engine_process import EngineProcess
from tests.deployments.engines.engine_helpers import GREEDY, PROMPTS, generate_all, run, with_engine

pytestmark = pytest.mark.integration

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)
WAIT_S = 60  # far above any call here (a few seconds): only a lost reply reaches it


def bounded(awaitable):
    return asyncio.wait_for(awaitable, timeout=WAIT_S)


@pytest.fixture(scope="module")
def engine_process(tiny_model_dir: Path):
    engine = EngineProcess(tiny_model_dir, max_model_len=4096, eos_token_ids=())
    yield engine
    engine.close()


def test_seeded_generations_equal_the_in_process_engine(tiny_model_dir: Path, engine_process: EngineProcess) -> None:
    async def local(engine):
        return await generate_all(engine, PROMPTS, SAMPLED, "local")

    async def remote():
        before = await bounded(engine_process.stats())
        outs = await bounded(generate_all(engine_process, PROMPTS, SAMPLED, "remote"))
        return outs, (await bounded(engine_process.stats()))["generated_tokens"] - before["generated_tokens"]

    expected = run(with_engine(tiny_model_dir, local, eos_token_ids=()))
    outs, generated = run(remote())
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    for out, want in zip(outs, expected):
        assert out.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert generated == 12 * len(PROMPTS)


def test_a_bad_request_fails_its_caller_and_the_engine_keeps_serving(engine_process: EngineProcess) -> None:
    async def body():
        with pytest.raises(ValueError, match=r"request 'bad-1'.*token id 999999"):
            await bounded(engine_process.generate([1, 999999], SAMPLED, "bad-1"))
        return await bounded(engine_process.generate(PROMPTS[0], SAMPLED, "after-bad"))

    assert len(run(body()).token_ids) == 12


def test_a_cancelled_call_frees_its_row(engine_process: EngineProcess) -> None:
    long = SamplingParams(temperature=1.0, max_new_tokens=4000, seed=1)

    async def body():
        before = (await bounded(engine_process.stats()))["generated_tokens"]
        task = asyncio.create_task(engine_process.generate(PROMPTS[1], long, "long-1"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await bounded(engine_process.generate(PROMPTS[0], SAMPLED, "after-cancel"))
        first = (await bounded(engine_process.stats()))["generated_tokens"]
        await asyncio.sleep(1.0)
        return before, first, (await bounded(engine_process.stats()))["generated_tokens"]

    before, first, later = run(body())
    assert first - before < 4000  # the long request stopped early
    assert later == first  # and nothing decodes any more


def test_calls_fail_when_the_engine_process_dies(tiny_model_dir: Path) -> None:
    engine = EngineProcess(tiny_model_dir, max_model_len=4096, eos_token_ids=())
    long = SamplingParams(temperature=1.0, max_new_tokens=4000, seed=2)

    async def body():
        task = asyncio.create_task(engine.generate(PROMPTS[2], long, "doomed-1"))
        await bounded(engine.stats())  # the process is up and serving
        engine._process.kill()
        with pytest.raises(RuntimeError, match="the engine process exited"):
            await bounded(task)

    try:
        run(body())
    finally:
        engine.close()


def test_adapters_load_over_the_pipe_as_in_the_engine(tiny_model_dir: Path, adapter_dirs,
                                                      engine_process: EngineProcess) -> None:
    v1 = AdapterRef(version=1, path=str(adapter_dirs[1]))

    async def local(engine):
        await engine.load_adapter(v1)
        return await generate_all(engine, PROMPTS, GREEDY, "local-v1")

    async def remote():
        base = await bounded(generate_all(engine_process, PROMPTS, GREEDY, "base"))
        await bounded(engine_process.load_adapter(v1))
        tuned = await bounded(generate_all(engine_process, PROMPTS, GREEDY, "v1"))
        await bounded(engine_process.load_adapter(AdapterRef(version=0)))
        back = await bounded(generate_all(engine_process, PROMPTS, GREEDY, "back"))
        return base, tuned, back

    expected = run(with_engine(tiny_model_dir, local, eos_token_ids=()))
    base, tuned, back = run(remote())
    assert [o.policy_version for o in base + tuned + back] == [0] * 6 + [1] * 6 + [0] * 6
    assert [o.token_ids for o in tuned] == [e.token_ids for e in expected]
    assert all(a.token_ids != b.token_ids for a, b in zip(base, tuned))  # the adapter was applied, not ignored
    assert [o.token_ids for o in back] == [o.token_ids for o in base]


def test_a_reply_that_cannot_be_read_fails_only_its_own_call() -> None:
    """The reader's side alone, over a real pipe: one reply's payload does not unpickle here; that call fails with
    its key named, the reply after it is still delivered, and the pipe's end fails what is left pending."""
    engine = EngineProcess.__new__(EngineProcess)  # no engine process: this test writes the replies itself
    engine._replies, writer = mp.Pipe(duplex=False)
    engine._process = SimpleNamespace(join=lambda timeout: None, exitcode=-9)
    engine._pending = {}

    async def body():
        loop = asyncio.get_running_loop()
        futures = {key: loop.create_future() for key in ("garbled", "fine", "never")}
        engine._pending.update({key: (loop, future) for key, future in futures.items()})
        threading.Thread(target=engine._read, daemon=True).start()
        writer.send(("garbled", True, b"\x80\x05 not a pickle"))
        writer.send(("fine", True, pickle.dumps({"generated_tokens": 3})))
        writer.close()
        with pytest.raises(RuntimeError, match=r"reply to 'garbled' could not be read here: UnpicklingError"):
            await bounded(futures["garbled"])
        assert await bounded(futures["fine"]) == {"generated_tokens": 3}
        with pytest.raises(RuntimeError, match=r"the engine process exited \(exit code -9\)"):
            await bounded(futures["never"])

    run(body())
