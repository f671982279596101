"""HFEngine on the real tiny model: batching, exactness against transformers, stops, limits, seeds, LoRA (the
prefill and its prefix cache: ``test_hf_prefill``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agents.records import AdapterRef, SamplingParams
from deployments.engines.base import PromptTooLong
from deployments.engines.hf_engine import HFEngine
from tests.deployments.engines.engine_helpers import (GREEDY, PROMPTS, generate_all, hf_greedy, hf_logprobs, run,
                                                      with_engine)

pytestmark = pytest.mark.integration


def test_concurrent_greedy_equals_transformers_generate(tiny_model_dir: Path, reference) -> None:
    async def body(engine: HFEngine):
        outs = await generate_all(engine, PROMPTS, GREEDY, "greedy")
        return outs, engine.stats

    outs, stats = run(with_engine(tiny_model_dir, body))
    for prompt, out in zip(PROMPTS, outs):
        assert list(out.token_ids) == hf_greedy(reference, prompt, GREEDY.max_new_tokens)
        assert len(out.logprobs) == len(out.token_ids)
        assert out.policy_version == 0
    assert stats["max_batch_size"] == len(PROMPTS)  # all six decoded together


def test_sixteen_concurrent_requests_share_batches(tiny_model_dir: Path) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]

    async def body(engine: HFEngine):
        outs = await generate_all(engine, prompts, sampling, "c")
        return outs, engine.stats

    outs, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert [len(o.token_ids) for o in outs] == [12] * 16
    assert all(o.finish_reason == "length" for o in outs)
    assert stats["max_batch_size"] == 16
    # 16 x 12 tokens: the first token of each comes from prefill, the other 11 from shared decode steps
    assert stats["generated_tokens"] == 16 * 12
    assert stats["decode_rows"] == 16 * 11
    assert stats["steps"] < 16 * 11


def test_logprobs_at_temperature_one_equal_model_log_softmax(tiny_model_dir: Path, reference) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)

    async def body(engine: HFEngine):
        return await generate_all(engine, PROMPTS[:4], sampling, "lp")

    for prompt, out in zip(PROMPTS[:4], run(with_engine(tiny_model_dir, body))):
        assert out.logprobs == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=1e-4)


def test_logprobs_are_of_the_raw_model_distribution_at_any_temperature(tiny_model_dir: Path, reference) -> None:
    sampling = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=8, seed=2)

    async def body(engine: HFEngine):
        return await engine.generate(PROMPTS[2], sampling, "tempered")

    out = run(with_engine(tiny_model_dir, body))
    assert out.logprobs == pytest.approx(hf_logprobs(reference, PROMPTS[2], out.token_ids), abs=1e-4)


def test_stop_tokens_end_generation_and_are_kept(tiny_model_dir: Path) -> None:
    seeded = SamplingParams(temperature=1.0, max_new_tokens=16, seed=9)
    free = run(with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], seeded, "free"), eos_token_ids=()))
    stop = free.token_ids[3]
    expected = free.token_ids[: free.token_ids.index(stop) + 1]
    with_stop = SamplingParams(temperature=1.0, max_new_tokens=16, seed=9, stop_token_ids=(stop,))
    out = run(with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], with_stop, "stop"), eos_token_ids=()))
    assert (out.token_ids, out.finish_reason) == (expected, "stop")
    # the same token configured as the engine's EOS
    eos_out = run(with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], seeded, "eos"), eos_token_ids=(stop,)))
    assert (eos_out.token_ids, eos_out.finish_reason) == (expected, "stop")


def test_length_limits(tiny_model_dir: Path) -> None:
    prompt = PROMPTS[3]  # 6 tokens

    async def body(engine: HFEngine):
        short = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5), "short")
        capped = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=50), "capped")
        return short, capped

    short, capped = run(with_engine(tiny_model_dir, body, max_model_len=10, eos_token_ids=()))
    assert (len(short.token_ids), short.finish_reason) == (4, "length")  # 6 + 4 = max_model_len 10
    assert (len(capped.token_ids), capped.finish_reason) == (4, "length")
    run_short = run(with_engine(tiny_model_dir, lambda e: e.generate(prompt, GREEDY, "n"), eos_token_ids=()))
    assert (len(run_short.token_ids), run_short.finish_reason) == (16, "length")


def test_prompt_too_long_is_rejected_with_its_request_id(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine):
        with pytest.raises(PromptTooLong, match=r"request 'long-1'.*8 tokens.*max_model_len is 8"):
            await engine.generate(list(range(10, 18)), GREEDY, "long-1")
        with pytest.raises(ValueError, match=r"request 'oov'.*token id 999999"):
            await engine.generate([5, 999999], GREEDY, "oov")
        return await engine.generate(list(range(10, 17)), GREEDY, "fits")  # 7 tokens leave room for one

    out = run(with_engine(tiny_model_dir, body, max_model_len=8))
    assert (len(out.token_ids), out.finish_reason) in {(1, "length"), (1, "stop")}


def test_seeds_reproduce_alone_and_in_a_batch(tiny_model_dir: Path) -> None:
    seeded = SamplingParams(temperature=1.0, max_new_tokens=12, seed=42)

    async def body(engine: HFEngine):
        alone = await engine.generate(PROMPTS[0], seeded, "alone")
        others = [engine.generate(p, SamplingParams(temperature=1.0, max_new_tokens=12), f"o{i}")
                  for i, p in enumerate(PROMPTS[1:])]
        batched, *_ = await asyncio.gather(engine.generate(PROMPTS[0], seeded, "batched"), *others)
        other_seed = await engine.generate(PROMPTS[0], SamplingParams(temperature=1.0, max_new_tokens=12, seed=43), "s")
        return alone, batched, other_seed

    alone, batched, other_seed = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert alone.token_ids == batched.token_ids
    assert alone.token_ids != other_seed.token_ids


def test_top_k_one_equals_greedy(tiny_model_dir: Path, reference) -> None:
    async def body(engine: HFEngine):
        return await engine.generate(PROMPTS[4], SamplingParams(temperature=1.5, top_k=1, max_new_tokens=16), "k1")

    out = run(with_engine(tiny_model_dir, body))
    assert list(out.token_ids) == hf_greedy(reference, PROMPTS[4], 16)


def test_adapter_changes_outputs_and_version_zero_restores_base(tiny_model_dir: Path, adapter_dirs) -> None:
    async def body(engine: HFEngine):
        base = await generate_all(engine, PROMPTS, GREEDY, "base")
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))
        v1 = await generate_all(engine, PROMPTS, GREEDY, "v1")
        await engine.load_adapter(AdapterRef(version=2, path=str(adapter_dirs[2])))
        v2 = await generate_all(engine, PROMPTS, GREEDY, "v2")
        await engine.load_adapter(AdapterRef(version=0))
        back = await generate_all(engine, PROMPTS, GREEDY, "back")
        return base, v1, v2, back

    base, v1, v2, back = run(with_engine(tiny_model_dir, body))
    assert [o.policy_version for o in base + v1 + v2 + back] == [0] * 6 + [1] * 6 + [2] * 6 + [0] * 6
    assert all(a.token_ids != b.token_ids for a, b in zip(base, v1))
    assert all(a.token_ids != b.token_ids for a, b in zip(v1, v2))
    assert [o.token_ids for o in back] == [o.token_ids for o in base]
    # the same weights, but behind peft's disabled LoRA layers: a padded batch's sums may round differently (measured
    # up to 4.8e-7); an adapter still switched on changes the greedy tokens themselves
    for out, ref in zip(back, base):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-6)


def test_version_zero_with_a_path_is_the_saved_adapter_a_run_starts_from(tiny_model_dir: Path, adapter_dirs) -> None:
    start = AdapterRef(version=0, path=str(adapter_dirs[1]))

    async def body(engine: HFEngine):
        base = await generate_all(engine, PROMPTS, GREEDY, "base")
        await engine.load_adapter(start)  # the first adapter this engine loads
        started = await generate_all(engine, PROMPTS, GREEDY, "start")
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))  # the same weights as v1
        v1 = await generate_all(engine, PROMPTS, GREEDY, "v1")
        await engine.load_adapter(AdapterRef(version=0))
        back = await generate_all(engine, PROMPTS, GREEDY, "back")
        await engine.load_adapter(start)  # after the base model: the adapter layers come back on
        again = await generate_all(engine, PROMPTS, GREEDY, "again")
        return base, started, v1, back, again

    base, started, v1, back, again = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert [o.policy_version for o in started + v1 + back + again] == [0] * 6 + [1] * 6 + [0] * 12
    assert [o.token_ids for o in started] == [o.token_ids for o in v1] == [o.token_ids for o in again]
    for a, b in zip(started, v1):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert all(a.token_ids != b.token_ids for a, b in zip(base, started))
    assert [o.token_ids for o in back] == [o.token_ids for o in base]
    for out, ref in zip(back, base):  # peft's disabled layers may round a padded batch differently, as above
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-6)


def test_greedy_with_adapter_equals_transformers_generate_of_the_peft_model(tiny_model_dir: Path, adapter_dirs) -> None:
    """The random base model mostly repeats its last prompt token; with the adapter greedy text varies."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    tuned = PeftModel.from_pretrained(base, str(adapter_dirs[1])).eval()

    async def body(engine: HFEngine):
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))
        return await generate_all(engine, PROMPTS, GREEDY, "tuned")

    outs = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            expected = tuned.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=16,
                                      eos_token_id=None)[0, len(prompt) :].tolist()
        assert list(out.token_ids) == expected
        assert out.logprobs == pytest.approx(hf_logprobs(tuned, prompt, out.token_ids), abs=1e-4)
    assert len({o.token_ids[-1] for o in outs}) > 1 and any(len(set(o.token_ids)) > 3 for o in outs)


def test_adapter_swap_drains_in_flight_requests(tiny_model_dir: Path, adapter_dirs) -> None:
    long_run = SamplingParams(temperature=0.0, max_new_tokens=40)

    async def body(engine: HFEngine):
        base_only = await engine.generate(PROMPTS[0], long_run, "base-only")
        in_flight = asyncio.create_task(engine.generate(PROMPTS[0], long_run, "old"))
        await asyncio.sleep(0)  # let the engine admit it
        swap = asyncio.create_task(engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1]))))
        await asyncio.sleep(0)
        after = await engine.generate(PROMPTS[0], long_run, "new")  # submitted during the swap
        await swap
        return base_only, await in_flight, after

    base_only, old, new = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert (old.policy_version, new.policy_version) == (0, 1)
    # every token of the in-flight request came from the base model, none from the new adapter
    assert (old.token_ids, old.logprobs) == (base_only.token_ids, base_only.logprobs)
    assert old.token_ids != new.token_ids


def test_interrupting_swap_continues_running_requests_with_the_new_adapter(tiny_model_dir: Path, adapter_dirs) -> None:
    long_run = SamplingParams(temperature=0.0, max_new_tokens=40)
    v1 = AdapterRef(version=1, path=str(adapter_dirs[1]))

    async def body(engine: HFEngine):
        base_only = await engine.generate(PROMPTS[0], long_run, "base-only")
        in_flight = asyncio.create_task(engine.generate(PROMPTS[0], long_run, "partial"))
        while engine.stats["generated_tokens"] < 40 + 5:  # the request is part-way through
            await asyncio.sleep(0.001)
        await engine.load_adapter(v1)  # returns between two decode steps, not after the request
        return base_only, await in_flight

    base_only, partial = run(with_engine(tiny_model_dir, body, eos_token_ids=(), swap="interrupt"))
    k = partial.token_versions.index(1)  # first token the new adapter sampled
    assert 5 <= k < 40 and set(partial.token_versions[k:]) == {1}
    assert partial.policy_version == 0  # the oldest version that sampled any token
    assert (partial.token_ids[:k], partial.logprobs[:k]) == (base_only.token_ids[:k], base_only.logprobs[:k])

    async def continuation(engine: HFEngine):
        await engine.load_adapter(v1)
        return await engine.generate(list(PROMPTS[0]) + list(partial.token_ids[:k]),
                                     SamplingParams(temperature=0.0, max_new_tokens=40 - k), "v1-from-prefix")

    # after the swap the request is exactly what adapter v1 generates from the tokens produced so far
    expected = run(with_engine(tiny_model_dir, continuation, eos_token_ids=()))
    assert partial.token_ids[k:] == expected.token_ids
    assert partial.logprobs[k:] == pytest.approx(expected.logprobs, abs=1e-4)
    assert partial.token_ids != base_only.token_ids


def test_an_interrupting_swap_continues_rows_of_different_lengths_with_the_new_adapter(tiny_model_dir: Path, adapter_dirs) -> None:
    long_run = SamplingParams(temperature=0.0, max_new_tokens=40)
    v1 = AdapterRef(version=1, path=str(adapter_dirs[1]))
    prompts = [PROMPTS[0], PROMPTS[5]]  # 3 and 8 tokens

    async def body(engine: HFEngine):
        in_flight = [asyncio.create_task(engine.generate(p, long_run, f"p{i}")) for i, p in enumerate(prompts)]
        while engine.stats["generated_tokens"] < 2 * 6:
            await asyncio.sleep(0.001)
        await engine.load_adapter(v1)
        return await asyncio.gather(*in_flight), engine.stats

    partials, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=(), swap="interrupt"))
    assert stats["interrupted_rows"] == 2

    async def continuation(engine: HFEngine, prompt, partial, k):
        await engine.load_adapter(v1)
        return await engine.generate(list(prompt) + list(partial.token_ids[:k]),
                                     SamplingParams(temperature=0.0, max_new_tokens=40 - k), "v1-from-prefix")

    for prompt, partial in zip(prompts, partials):
        k = partial.token_versions.index(1)
        assert 6 <= k < 40 and set(partial.token_versions[k:]) == {1}
        expected = run(with_engine(tiny_model_dir, lambda e: continuation(e, prompt, partial, k), eos_token_ids=()))
        assert partial.token_ids[k:] == expected.token_ids
        assert partial.logprobs[k:] == pytest.approx(expected.logprobs, abs=1e-4)


def test_bad_adapter_path_fails_the_load_and_keeps_serving(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(engine: HFEngine):
        with pytest.raises(FileNotFoundError, match="adapter version 3"):
            await engine.load_adapter(AdapterRef(version=3, path=str(tmp_path / "missing")))
        return await engine.generate(PROMPTS[0], GREEDY, "after-bad-load")

    out = run(with_engine(tiny_model_dir, body))
    assert out.policy_version == 0 and len(out.token_ids) > 0


def test_cancelled_request_frees_its_row(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine):
        doomed = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=200), "doomed"))
        await asyncio.sleep(0.05)
        doomed.cancel()
        out = await engine.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=5), "next")
        return out, engine.stats

    out, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert len(out.token_ids) == 5
    assert stats["generated_tokens"] < 200  # the cancelled request stopped decoding


def test_float32_cpu_weights_are_packed_once_and_match_the_plain_forward(tiny_model_dir: Path) -> None:
    """``pack_weights`` (the default): every nn.Linear multiplies with its weight packed for oneDNN; the logits equal the
    plain forward's to float32 rounding (the greedy and log-prob tests above compare the packed engine with plain
    transformers too). A bfloat16 engine and ``pack_weights=False`` keep plain layers."""
    packed = HFEngine(str(tiny_model_dir), max_model_len=64)
    plain = HFEngine(str(tiny_model_dir), max_model_len=64, pack_weights=False)
    linears = sum(isinstance(m, torch.nn.Linear) for m in plain._model.modules())
    assert packed.packed_linears == linears > 0 and plain.packed_linears == 0
    ids = torch.randint(0, 200, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = packed._model(input_ids=ids).logits, plain._model(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)  # oneDNN's packed kernel: equal or within rounding, by CPU
    # The packed copies are what multiply: with every plain Linear weight zeroed (the head's too, tied to the
    # embedding: the inputs go in as embeddings taken before), the packed model's logits do not move, while the plain
    # model's do. (Bit-equality of a and b says nothing either way: on some CPUs both paths run the same kernel.)
    with torch.inference_mode():
        embeds = packed._model.get_input_embeddings()(ids)
        for engine in (packed, plain):
            for m in engine._model.modules():
                if isinstance(m, torch.nn.Linear):
                    m.weight.zero_()
        assert torch.equal(packed._model(inputs_embeds=embeds).logits, a)
        assert not torch.allclose(plain._model(inputs_embeds=embeds).logits, b, atol=1e-2)
    assert HFEngine(str(tiny_model_dir), max_model_len=64, dtype="bfloat16").packed_linears == 0
