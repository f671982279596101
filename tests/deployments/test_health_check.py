"""``RolloutServer.check_health`` on a real ``HFEngine``: a real generate when idle; while requests run, the engine's
liveness instead of a probe queued behind them (a slow model's prefill outlasted Serve's 30 s health-check timeout
and Serve replaced a working replica)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agents.records import GenerateRequest, SamplingParams
from deployments.engines.hf_engine import HFEngine
from deployments.rollout_server import RolloutServer

pytestmark = pytest.mark.integration


def test_busy_replica_answers_health_checks_at_once_and_a_stopped_engine_loop_fails_them(tiny_model_dir):
    async def scenario():
        engine = HFEngine(str(tiny_model_dir), max_model_len=64)
        server = RolloutServer(engine, replica_id="r0")
        await server.check_health()  # idle: a real one-token generate
        assert engine.stats["generated_tokens"] == 1
        hold = threading.Event()
        real_step = engine._step

        def held_step(*args):  # the model work of the next step waits (a long prefill on a slow machine)
            hold.wait(60)
            return real_step(*args)

        engine._step = held_step
        request = GenerateRequest(prompt_ids=(1, 2, 3), sampling=SamplingParams(max_new_tokens=4, seed=0))
        running = asyncio.create_task(server.generate(request))
        await asyncio.sleep(0.2)
        await asyncio.wait_for(server.check_health(), 5)  # busy: answered without waiting for the step
        assert not running.done()
        hold.set()
        result = await asyncio.wait_for(running, 60)
        assert len(result.token_ids) >= 1
        engine._step = real_step

        def broken_admit():
            raise RuntimeError("admission bug")

        engine._admit = broken_admit  # outside the per-batch fault boundary: the engine loop itself stops
        stuck = asyncio.create_task(server.generate(request))
        await asyncio.sleep(0.2)
        with pytest.raises(RuntimeError, match=r"replica r0: HFEngine\(.*\) loop stopped \(RuntimeError\('admission bug'\)"):
            await asyncio.wait_for(server.check_health(), 5)
        stuck.cancel()
        await engine.close()

    asyncio.run(scenario())
