"""The adapter-swap gate of ``RolloutServer``: a swap waits for running generates and holds back new ones."""

import asyncio

import pytest

from deployments.rollout_server import _VersionGate

pytestmark = pytest.mark.unit


async def _settle():
    for _ in range(5):
        await asyncio.sleep(0)


def test_swap_waits_for_running_generates_and_blocks_new_ones():
    async def scenario():
        gate = _VersionGate()
        events: list[str] = []
        release_first = asyncio.Event()

        async def generate(name: str, hold: asyncio.Event | None = None):
            async with gate.generating():
                events.append(f"{name} start")
                if hold is not None:
                    await hold.wait()
                events.append(f"{name} end")

        async def swap():
            async with gate.swapping():
                events.append("swap")

        first = asyncio.create_task(generate("g1", release_first))
        await _settle()
        swapper = asyncio.create_task(swap())
        await _settle()
        second = asyncio.create_task(generate("g2"))
        await _settle()
        assert events == ["g1 start"]  # the swap waits for g1; g2 waits behind the swap
        release_first.set()
        await asyncio.gather(first, swapper, second)
        return events

    assert asyncio.run(scenario()) == ["g1 start", "g1 end", "swap", "g2 start", "g2 end"]


def test_generates_run_together_without_a_swap():
    async def scenario():
        gate = _VersionGate()
        inside = 0
        peak = 0

        async def generate():
            nonlocal inside, peak
            async with gate.generating():
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(generate() for _ in range(4)))
        return peak

    assert asyncio.run(scenario()) == 4


@pytest.mark.integration
def test_interrupting_engine_swaps_without_waiting_for_running_generates(tiny_model_dir, adapter_paths):
    from agents.records import AdapterRef, GenerateRequest, SamplingParams
    from deployments.engines.hf_engine import HFEngine
    from deployments.rollout_server import RolloutServer

    long_run = SamplingParams(temperature=0.0, max_new_tokens=200)

    async def scenario():
        engine = HFEngine(str(tiny_model_dir), max_model_len=256, eos_token_ids=(), swap="interrupt")
        server = RolloutServer(engine, replica_id="r0")
        try:
            running = asyncio.create_task(server.generate(GenerateRequest(prompt_ids=(5, 6, 7), sampling=long_run)))
            while engine.stats["generated_tokens"] < 5:
                await asyncio.sleep(0.001)
            swap = asyncio.create_task(server.load_adapter(AdapterRef(version=1, path=str(adapter_paths[1]))))
            done, _ = await asyncio.wait({running, swap}, return_when=asyncio.FIRST_COMPLETED)
            order = ["swap" if swap in done else "generate"]
            after = await server.generate(GenerateRequest(prompt_ids=(5, 6, 7), sampling=SamplingParams(max_new_tokens=4)))
            return order, await running, after
        finally:
            await engine.close()

    order, partial, after = asyncio.run(scenario())
    assert order == ["swap"]  # the swap did not wait for the 200-token generate
    assert len(partial.token_ids) == 200 and partial.policy_version == 0  # oldest adapter that sampled a token
    assert after.policy_version == 1
