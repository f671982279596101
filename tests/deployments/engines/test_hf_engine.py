"""HFEngine on the real tiny model: batching, exactness against transformers, stops, limits, seeds, LoRA."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agents.records import AdapterRef, SamplingParams
from deployments.engines.base import EngineOutput, PromptTooLong
from deployments.engines import hf_engine
from deployments.engines.hf_engine import HFEngine

pytestmark = pytest.mark.integration

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
PROMPTS = [[5 + 7 * i + j for j in range(3 + i)] for i in range(6)]  # lengths 3..8, distinct tokens


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def run(coro):
    return asyncio.run(coro)


async def _generate_all(engine: HFEngine, prompts, sampling: SamplingParams, tag: str) -> list[EngineOutput]:
    return list(await asyncio.gather(*[engine.generate(p, sampling, f"{tag}-{i}") for i, p in enumerate(prompts)]))


async def _with_engine(model_dir: Path, body, **kwargs):
    engine_class = kwargs.pop("engine", HFEngine)
    engine = engine_class(str(model_dir), max_model_len=kwargs.pop("max_model_len", 256), **kwargs)
    try:
        return await body(engine)
    finally:
        await engine.close()


def _hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(model, prompt: list[int], generated: tuple[int, ...]) -> list[float]:
    """log_softmax of one forward pass over prompt + generated, at the generated tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + list(generated)])).logits[0, len(prompt) - 1 : -1]  # [N, V]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(generated)[:, None])[:, 0].tolist()


def test_concurrent_greedy_equals_transformers_generate(tiny_model_dir: Path, reference) -> None:
    async def body(engine: HFEngine):
        outs = await _generate_all(engine, PROMPTS, GREEDY, "greedy")
        return outs, engine.stats

    outs, stats = run(_with_engine(tiny_model_dir, body))
    for prompt, out in zip(PROMPTS, outs):
        assert list(out.token_ids) == _hf_greedy(reference, prompt, GREEDY.max_new_tokens)
        assert len(out.logprobs) == len(out.token_ids)
        assert out.policy_version == 0
    assert stats["max_batch_size"] == len(PROMPTS)  # all six decoded together


def test_sixteen_concurrent_requests_share_batches(tiny_model_dir: Path) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]

    async def body(engine: HFEngine):
        outs = await _generate_all(engine, prompts, sampling, "c")
        return outs, engine.stats

    outs, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
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
        return await _generate_all(engine, PROMPTS[:4], sampling, "lp")

    for prompt, out in zip(PROMPTS[:4], run(_with_engine(tiny_model_dir, body))):
        assert out.logprobs == pytest.approx(_hf_logprobs(reference, prompt, out.token_ids), abs=1e-4)


def test_logprobs_are_of_the_raw_model_distribution_at_any_temperature(tiny_model_dir: Path, reference) -> None:
    sampling = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, max_new_tokens=8, seed=2)

    async def body(engine: HFEngine):
        return await engine.generate(PROMPTS[2], sampling, "tempered")

    out = run(_with_engine(tiny_model_dir, body))
    assert out.logprobs == pytest.approx(_hf_logprobs(reference, PROMPTS[2], out.token_ids), abs=1e-4)


def test_stop_tokens_end_generation_and_are_kept(tiny_model_dir: Path) -> None:
    seeded = SamplingParams(temperature=1.0, max_new_tokens=16, seed=9)
    free = run(_with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], seeded, "free"), eos_token_ids=()))
    stop = free.token_ids[3]
    expected = free.token_ids[: free.token_ids.index(stop) + 1]
    with_stop = SamplingParams(temperature=1.0, max_new_tokens=16, seed=9, stop_token_ids=(stop,))
    out = run(_with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], with_stop, "stop"), eos_token_ids=()))
    assert (out.token_ids, out.finish_reason) == (expected, "stop")
    # the same token configured as the engine's EOS
    eos_out = run(_with_engine(tiny_model_dir, lambda e: e.generate(PROMPTS[1], seeded, "eos"), eos_token_ids=(stop,)))
    assert (eos_out.token_ids, eos_out.finish_reason) == (expected, "stop")


def test_length_limits(tiny_model_dir: Path) -> None:
    prompt = PROMPTS[3]  # 6 tokens

    async def body(engine: HFEngine):
        short = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5), "short")
        capped = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=50), "capped")
        return short, capped

    short, capped = run(_with_engine(tiny_model_dir, body, max_model_len=10, eos_token_ids=()))
    assert (len(short.token_ids), short.finish_reason) == (4, "length")  # 6 + 4 = max_model_len 10
    assert (len(capped.token_ids), capped.finish_reason) == (4, "length")
    run_short = run(_with_engine(tiny_model_dir, lambda e: e.generate(prompt, GREEDY, "n"), eos_token_ids=()))
    assert (len(run_short.token_ids), run_short.finish_reason) == (16, "length")


def test_prompt_too_long_is_rejected_with_its_request_id(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine):
        with pytest.raises(PromptTooLong, match=r"request 'long-1'.*8 tokens.*max_model_len is 8"):
            await engine.generate(list(range(10, 18)), GREEDY, "long-1")
        with pytest.raises(ValueError, match=r"request 'oov'.*token id 999999"):
            await engine.generate([5, 999999], GREEDY, "oov")
        return await engine.generate(list(range(10, 17)), GREEDY, "fits")  # 7 tokens leave room for one

    out = run(_with_engine(tiny_model_dir, body, max_model_len=8))
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

    alone, batched, other_seed = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert alone.token_ids == batched.token_ids
    assert alone.token_ids != other_seed.token_ids


class _NoDedupeEngine(HFEngine):
    """HFEngine forwarding every prompt of an admitted group, duplicates included (the path before dedupe)."""

    @staticmethod
    def _distinct_rows(sequences):
        return list(range(len(sequences))), list(range(len(sequences)))


def test_identical_prompts_are_prefilled_once_and_sample_as_if_not(tiny_model_dir: Path) -> None:
    """A GRPO group: n requests with one prompt at once. Same outputs as forwarding each, 2 prefills not 11."""
    twin = [t + 40 for t in PROMPTS[2]]  # another prompt of the same length: prefilled in the same group
    prompts = [PROMPTS[2]] * 4 + [twin] * 3 + [PROMPTS[2]] * 4
    requests = [(p, SamplingParams(temperature=1.0, max_new_tokens=12, seed=i)) for i, p in enumerate(prompts)]
    requests.append((PROMPTS[2], GREEDY))

    async def body(engine: HFEngine):
        outs = await asyncio.gather(*[engine.generate(p, s, f"g{i}") for i, (p, s) in enumerate(requests)])
        return outs, engine.stats

    outs, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    expected, plain_stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), engine=_NoDedupeEngine))
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    for out, ref in zip(outs, expected):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-6)
    assert len({o.token_ids for o in outs[:4] + outs[7:11]}) > 1  # each duplicate drew with its own seed
    length = len(PROMPTS[2])
    assert (stats["prefill_tokens"], stats["prefill_tokens_shared"]) == (2 * length, 10 * length)
    assert (plain_stats["prefill_tokens"], plain_stats["prefill_tokens_shared"]) == (12 * length, 0)


def test_prompts_sharing_a_long_prefix_reuse_its_cache_and_generate_the_same(tiny_model_dir: Path, adapter_dirs) -> None:
    """An agent's prompts share a system prompt; a later turn extends an earlier prompt. The prefix cache
    forwards only what follows a stored prefix; outputs equal the engine without it; an adapter swap clears it."""
    system = [11 + (7 * j) % 90 for j in range(40)]
    first = [system + [200 + i, 201 + i, 202] for i in range(3)]  # three questions after one system prompt
    second_turn = first[0] + [300, 301, 302, 303]  # episode 0's next prompt

    async def body(engine: HFEngine):
        outs = [await engine.generate(p, GREEDY, f"a{i}") for i, p in enumerate(first)]
        outs.append(await engine.generate(second_turn, GREEDY, "turn2"))
        cached = engine.stats["prefill_tokens_cached"]
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))
        after_swap = engine.stats["prefill_tokens_cached"]
        outs.append(await engine.generate(first[2], GREEDY, "v1"))
        return outs, cached, engine.stats["prefill_tokens_cached"] - after_swap, engine.stats

    outs, cached, cached_after_swap, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, plain_cached, _, plain_stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=(),
                                                           prefix_cache_min_tokens=0))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, ref in zip(outs, plain):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    # stored when prompt 1 met prompt 0 (their common prefix); prompt 2 and episode 0's next turn reuse it
    assert cached == 2 * len(system) and plain_cached == 0
    assert cached_after_swap == 0  # the v1 prefill cannot use keys computed by the base model
    computed = sum(len(p) for p in first) + len(second_turn) + len(first[2])
    assert stats["prefill_tokens"] + stats["prefill_tokens_cached"] == computed == plain_stats["prefill_tokens"]


def test_a_burst_of_prompts_forwards_their_common_prefix_once(tiny_model_dir: Path) -> None:
    system = [11 + (7 * j) % 90 for j in range(40)]
    prompts = [system + [200 + i, 201, 202 + i] for i in range(4)]

    async def body(engine: HFEngine):
        outs = await _generate_all(engine, prompts, GREEDY, "burst")
        return outs, engine.stats

    outs, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _ = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert (stats["prefill_tokens"], stats["prefill_tokens_cached"]) == (len(system) + 4 * 3, 4 * len(system))


def test_prompts_of_different_lengths_are_prefilled_in_one_padded_forward(tiny_model_dir: Path, reference) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)

    async def together(engine: HFEngine):
        outs = await _generate_all(engine, PROMPTS, sampling, "mixed")
        return outs, engine.stats

    async def one_by_one(engine: HFEngine):
        return [await engine.generate(p, sampling, f"solo-{i}") for i, p in enumerate(PROMPTS)]

    outs, stats = run(_with_engine(tiny_model_dir, together, eos_token_ids=()))
    alone = run(_with_engine(tiny_model_dir, one_by_one, eos_token_ids=()))
    assert stats["prefill_forwards"] == 1  # lengths 3..8, one batch
    assert stats["prefill_tokens"] == sum(len(p) for p in PROMPTS)  # the padding is not counted as prefill work
    for prompt, out, solo in zip(PROMPTS, outs, alone):
        assert out.token_ids == solo.token_ids
        assert out.logprobs == pytest.approx(solo.logprobs, abs=1e-5)
        assert out.logprobs == pytest.approx(_hf_logprobs(reference, prompt, out.token_ids), abs=1e-4)


def test_a_prefill_larger_than_its_token_budget_is_split_and_generates_the_same(tiny_model_dir: Path, monkeypatch) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=4)

    async def body(engine: HFEngine):
        outs = await _generate_all(engine, PROMPTS, sampling, "budget")
        return outs, engine.stats

    whole, whole_stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    monkeypatch.setattr(hf_engine, "PREFILL_TOKENS", 12)  # lengths 3..8 padded: [3, 4] (8), [5, 6] (12), [7], [8]
    split, split_stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert (whole_stats["prefill_forwards"], split_stats["prefill_forwards"]) == (1, 4)
    assert split_stats["prefill_tokens"] == whole_stats["prefill_tokens"] == sum(len(p) for p in PROMPTS)
    assert [o.token_ids for o in split] == [o.token_ids for o in whole]
    for out, ref in zip(split, whole):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_a_prefix_cut_from_a_left_padded_row_is_the_prompts_own(tiny_model_dir: Path) -> None:
    """A prompt prefilled in a padded batch is remembered from its own positions, not the padding: the next prompt
    sharing its prefix reuses those keys and generates what the engine without a prefix cache generates."""
    system = [11 + (7 * j) % 90 for j in range(40)]
    first = system + [200]
    padded = system + [201, 202]  # shorter than ``other``, so left-padded in the batch below
    other = [300 + j for j in range(50)]  # shares nothing with it: no common prefix to forward first
    last = system + [203, 204, 205]

    async def body(engine: HFEngine):
        outs = [await engine.generate(first, GREEDY, "first")]
        outs += await asyncio.gather(engine.generate(padded, GREEDY, "padded"), engine.generate(other, GREEDY, "other"))
        forwards, cached = engine.stats["prefill_forwards"], engine.stats["prefill_tokens_cached"]
        outs.append(await engine.generate(last, GREEDY, "last"))
        return outs, forwards, engine.stats["prefill_tokens_cached"] - cached

    outs, forwards, cached = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _, _ = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    assert forwards == 2 and cached == len(system)  # stored when ``padded`` met ``first``; ``last`` reuses it
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, ref in zip(outs, plain):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_an_episodes_next_turn_forwards_only_what_follows_its_finished_turn(tiny_model_dir: Path) -> None:
    """A finished request's sequence is kept: the next turn (prompt, response, the tool's answer) forwards only the
    response's last token and the answer, and generates what the engine without a prefix cache generates."""
    first = [11 + (7 * j) % 90 for j in range(40)] + [200, 201, 202]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)

    async def body(engine: HFEngine):
        turn1 = await engine.generate(first, sampling, "turn1")
        second = first + list(turn1.token_ids) + [300, 301, 302]  # the tool's answer after the response
        before = dict(engine.stats)
        turn2 = await engine.generate(second, sampling, "turn2")
        return [turn1, turn2], {k: engine.stats[k] - before[k] for k in ("prefill_tokens", "prefill_tokens_cached")}

    outs, counts = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, plain_counts = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    assert counts == {"prefill_tokens": 1 + 3, "prefill_tokens_cached": len(first) + 8 - 1}
    assert plain_counts == {"prefill_tokens": len(first) + 8 + 3, "prefill_tokens_cached": 0}
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, ref in zip(outs, plain):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_turns_after_different_stored_prefixes_are_prefilled_in_one_forward(tiny_model_dir: Path) -> None:
    """Two episodes' next turns (each after its own finished turn) and a new prompt admitted together: one forward,
    each row after its own prefix, each output what the engine without a prefix cache generates."""
    system = [11 + (7 * j) % 90 for j in range(40)]
    firsts = [system + [200 + i] * (1 + 2 * i) for i in range(2)]  # different lengths, so prefixes differ too
    fresh = [400 + j for j in range(5)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=6)

    async def body(engine: HFEngine):
        turn1 = [await engine.generate(p, sampling, f"e{i}-1") for i, p in enumerate(firsts)]
        seconds = [p + list(o.token_ids) + [300 + i] * (2 + i) for i, (p, o) in enumerate(zip(firsts, turn1))]
        before = dict(engine.stats)
        turn2 = await _generate_all(engine, seconds + [fresh], sampling, "together")
        counts = {k: engine.stats[k] - before[k] for k in ("prefill_forwards", "prefill_tokens", "prefill_tokens_cached")}
        return turn1 + turn2, counts

    outs, counts = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _ = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    cached = [len(p) + 6 - 1 for p in firsts]
    assert counts == {"prefill_forwards": 1, "prefill_tokens": (1 + 2) + (1 + 3) + len(fresh),
                      "prefill_tokens_cached": sum(cached)}
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, ref in zip(outs, plain):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


def test_top_k_one_equals_greedy(tiny_model_dir: Path, reference) -> None:
    async def body(engine: HFEngine):
        return await engine.generate(PROMPTS[4], SamplingParams(temperature=1.5, top_k=1, max_new_tokens=16), "k1")

    out = run(_with_engine(tiny_model_dir, body))
    assert list(out.token_ids) == _hf_greedy(reference, PROMPTS[4], 16)


def test_adapter_changes_outputs_and_version_zero_restores_base(tiny_model_dir: Path, adapter_dirs) -> None:
    async def body(engine: HFEngine):
        base = await _generate_all(engine, PROMPTS, GREEDY, "base")
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))
        v1 = await _generate_all(engine, PROMPTS, GREEDY, "v1")
        await engine.load_adapter(AdapterRef(version=2, path=str(adapter_dirs[2])))
        v2 = await _generate_all(engine, PROMPTS, GREEDY, "v2")
        await engine.load_adapter(AdapterRef(version=0))
        back = await _generate_all(engine, PROMPTS, GREEDY, "back")
        return base, v1, v2, back

    base, v1, v2, back = run(_with_engine(tiny_model_dir, body))
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
        base = await _generate_all(engine, PROMPTS, GREEDY, "base")
        await engine.load_adapter(start)  # the first adapter this engine loads
        started = await _generate_all(engine, PROMPTS, GREEDY, "start")
        await engine.load_adapter(AdapterRef(version=1, path=str(adapter_dirs[1])))  # the same weights as v1
        v1 = await _generate_all(engine, PROMPTS, GREEDY, "v1")
        await engine.load_adapter(AdapterRef(version=0))
        back = await _generate_all(engine, PROMPTS, GREEDY, "back")
        await engine.load_adapter(start)  # after the base model: the adapter layers come back on
        again = await _generate_all(engine, PROMPTS, GREEDY, "again")
        return base, started, v1, back, again

    base, started, v1, back, again = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
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
        return await _generate_all(engine, PROMPTS, GREEDY, "tuned")

    outs = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    for prompt, out in zip(PROMPTS, outs):
        with torch.no_grad():
            expected = tuned.generate(input_ids=torch.tensor([prompt]), do_sample=False, max_new_tokens=16,
                                      eos_token_id=None)[0, len(prompt) :].tolist()
        assert list(out.token_ids) == expected
        assert out.logprobs == pytest.approx(_hf_logprobs(tuned, prompt, out.token_ids), abs=1e-4)
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

    base_only, old, new = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
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

    base_only, partial = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), swap="interrupt"))
    k = partial.token_versions.index(1)  # first token the new adapter sampled
    assert 5 <= k < 40 and set(partial.token_versions[k:]) == {1}
    assert partial.policy_version == 0  # the oldest version that sampled any token
    assert (partial.token_ids[:k], partial.logprobs[:k]) == (base_only.token_ids[:k], base_only.logprobs[:k])

    async def continuation(engine: HFEngine):
        await engine.load_adapter(v1)
        return await engine.generate(list(PROMPTS[0]) + list(partial.token_ids[:k]),
                                     SamplingParams(temperature=0.0, max_new_tokens=40 - k), "v1-from-prefix")

    # after the swap the request is exactly what adapter v1 generates from the tokens produced so far
    expected = run(_with_engine(tiny_model_dir, continuation, eos_token_ids=()))
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

    partials, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=(), swap="interrupt"))
    assert stats["interrupted_rows"] == 2

    async def continuation(engine: HFEngine, prompt, partial, k):
        await engine.load_adapter(v1)
        return await engine.generate(list(prompt) + list(partial.token_ids[:k]),
                                     SamplingParams(temperature=0.0, max_new_tokens=40 - k), "v1-from-prefix")

    for prompt, partial in zip(prompts, partials):
        k = partial.token_versions.index(1)
        assert 6 <= k < 40 and set(partial.token_versions[k:]) == {1}
        expected = run(_with_engine(tiny_model_dir, lambda e: continuation(e, prompt, partial, k), eos_token_ids=()))
        assert partial.token_ids[k:] == expected.token_ids
        assert partial.logprobs[k:] == pytest.approx(expected.logprobs, abs=1e-4)


def test_bad_adapter_path_fails_the_load_and_keeps_serving(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def body(engine: HFEngine):
        with pytest.raises(FileNotFoundError, match="adapter version 3"):
            await engine.load_adapter(AdapterRef(version=3, path=str(tmp_path / "missing")))
        return await engine.generate(PROMPTS[0], GREEDY, "after-bad-load")

    out = run(_with_engine(tiny_model_dir, body))
    assert out.policy_version == 0 and len(out.token_ids) > 0


def test_cancelled_request_frees_its_row(tiny_model_dir: Path) -> None:
    async def body(engine: HFEngine):
        doomed = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=200), "doomed"))
        await asyncio.sleep(0.05)
        doomed.cancel()
        out = await engine.generate(PROMPTS[1], SamplingParams(temperature=0.0, max_new_tokens=5), "next")
        return out, engine.stats

    out, stats = run(_with_engine(tiny_model_dir, body, eos_token_ids=()))
    assert len(out.token_ids) == 5
    assert stats["generated_tokens"] < 200  # the cancelled request stopped decoding
