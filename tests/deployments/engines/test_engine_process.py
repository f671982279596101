"""``benchmarks.engine_process``: the benchmarks' engine in its own process answers as the in-process engine does,
reports a bad request's error to its caller and keeps serving, and frees the row of a call its caller cancelled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.records import SamplingParams
from benchmarks.engine_process import EngineProcess
from tests.deployments.engines.engine_helpers import PROMPTS, generate_all, run, with_engine

pytestmark = pytest.mark.integration

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)


@pytest.fixture(scope="module")
def engine_process(tiny_model_dir: Path):
    engine = EngineProcess(tiny_model_dir, max_model_len=4096, eos_token_ids=())
    yield engine
    engine.close()


def test_seeded_generations_equal_the_in_process_engine(tiny_model_dir: Path, engine_process: EngineProcess) -> None:
    async def local(engine):
        return await generate_all(engine, PROMPTS, SAMPLED, "local")

    async def remote():
        before = await engine_process.stats()
        outs = await generate_all(engine_process, PROMPTS, SAMPLED, "remote")
        return outs, (await engine_process.stats())["generated_tokens"] - before["generated_tokens"]

    expected = run(with_engine(tiny_model_dir, local, eos_token_ids=()))
    outs, generated = run(remote())
    assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    for out, want in zip(outs, expected):
        assert out.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert generated == 12 * len(PROMPTS)


def test_a_bad_request_fails_its_caller_and_the_engine_keeps_serving(engine_process: EngineProcess) -> None:
    async def body():
        with pytest.raises(ValueError, match=r"request 'bad-1'.*token id 999999"):
            await engine_process.generate([1, 999999], SAMPLED, "bad-1")
        return await engine_process.generate(PROMPTS[0], SAMPLED, "after-bad")

    assert len(run(body()).token_ids) == 12


def test_a_cancelled_call_frees_its_row(engine_process: EngineProcess) -> None:
    long = SamplingParams(temperature=1.0, max_new_tokens=4000, seed=1)

    async def body():
        before = (await engine_process.stats())["generated_tokens"]
        task = asyncio.create_task(engine_process.generate(PROMPTS[1], long, "long-1"))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await engine_process.generate(PROMPTS[0], SAMPLED, "after-cancel")
        first = (await engine_process.stats())["generated_tokens"]
        await asyncio.sleep(1.0)
        return before, first, (await engine_process.stats())["generated_tokens"]

    before, first, later = run(body())
    assert first - before < 4000  # the long request stopped early
    assert later == first  # and nothing decodes any more


def test_calls_fail_when_the_engine_process_dies(tiny_model_dir: Path) -> None:
    engine = EngineProcess(tiny_model_dir, max_model_len=4096, eos_token_ids=())
    long = SamplingParams(temperature=1.0, max_new_tokens=4000, seed=2)

    async def body():
        task = asyncio.create_task(engine.generate(PROMPTS[2], long, "doomed-1"))
        await engine.stats()  # the process is up and serving
        engine._process.kill()
        with pytest.raises(RuntimeError, match="the engine process exited"):
            await asyncio.wait_for(task, timeout=30)

    try:
        run(body())
    finally:
        engine.close()
