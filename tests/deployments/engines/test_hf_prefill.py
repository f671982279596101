"""HFEngine's prefill on the real tiny model: identical prompts forwarded once, stored prefixes and finished turns
reused, prompts of different lengths and after different prefixes in one forward, the token budget; each against
the engine without the optimisation (``hf_prefill``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.records import AdapterRef, SamplingParams
from deployments.engines import hf_prefill
from deployments.engines.hf_engine import HFEngine
from tests.deployments.engines.engine_helpers import GREEDY, PROMPTS, generate_all, hf_logprobs, run, with_engine

pytestmark = pytest.mark.integration


def test_identical_prompts_are_prefilled_once_and_sample_as_if_not(tiny_model_dir: Path, monkeypatch) -> None:
    """A GRPO group: n requests with one prompt at once. Same outputs as forwarding each, 2 prefills not 11."""
    twin = [t + 40 for t in PROMPTS[2]]  # another prompt of the same length: prefilled in the same group
    prompts = [PROMPTS[2]] * 4 + [twin] * 3 + [PROMPTS[2]] * 4
    requests = [(p, SamplingParams(temperature=1.0, max_new_tokens=12, seed=i)) for i, p in enumerate(prompts)]
    requests.append((PROMPTS[2], GREEDY))

    async def body(engine: HFEngine):
        outs = await asyncio.gather(*[engine.generate(p, s, f"g{i}") for i, (p, s) in enumerate(requests)])
        return outs, engine.stats

    outs, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    # every prompt forwarded, duplicates included (the path before dedupe)
    monkeypatch.setattr(hf_prefill, "distinct_rows", lambda s: (list(range(len(s))), list(range(len(s)))))
    expected, plain_stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
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

    outs, cached, cached_after_swap, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, plain_cached, _, plain_stats = run(with_engine(tiny_model_dir, body, eos_token_ids=(),
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
        outs = await generate_all(engine, prompts, GREEDY, "burst")
        return outs, engine.stats

    outs, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _ = run(with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert (stats["prefill_tokens"], stats["prefill_tokens_cached"]) == (len(system) + 4 * 3, 4 * len(system))


def test_a_burst_over_two_system_prompts_forwards_each_prefix_once(tiny_model_dir: Path) -> None:
    """The SQL agent's burst: questions over two databases, one system prompt (schema) each, interleaved; their common
    prefix is a few tokens, each database's is long."""
    head = [11 + (7 * j) % 90 for j in range(6)]
    systems = [head + [100 + (5 * j + 3 * d) % 80 for j in range(40)] for d in range(2)]
    prompts = [systems[i % 2] + [200 + i, 201, 202 + i] for i in range(6)]

    async def body(engine: HFEngine):
        outs = await generate_all(engine, prompts, GREEDY, "burst2")
        return outs, engine.stats

    outs, stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _ = run(with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    prefix = len(systems[0])
    assert (stats["prefill_tokens"], stats["prefill_tokens_cached"]) == (2 * prefix + 6 * 3, 6 * prefix)


def test_prompts_of_different_lengths_are_prefilled_in_one_padded_forward(tiny_model_dir: Path, reference) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)

    async def together(engine: HFEngine):
        outs = await generate_all(engine, PROMPTS, sampling, "mixed")
        return outs, engine.stats

    async def one_by_one(engine: HFEngine):
        return [await engine.generate(p, sampling, f"solo-{i}") for i, p in enumerate(PROMPTS)]

    outs, stats = run(with_engine(tiny_model_dir, together, eos_token_ids=()))
    alone = run(with_engine(tiny_model_dir, one_by_one, eos_token_ids=()))
    assert stats["prefill_forwards"] == 1  # lengths 3..8, one batch
    assert stats["prefill_tokens"] == sum(len(p) for p in PROMPTS)  # the padding is not counted as prefill work
    for prompt, out, solo in zip(PROMPTS, outs, alone):
        assert out.token_ids == solo.token_ids
        assert out.logprobs == pytest.approx(solo.logprobs, abs=1e-5)
        assert out.logprobs == pytest.approx(hf_logprobs(reference, prompt, out.token_ids), abs=1e-4)


def test_a_prefill_larger_than_its_token_budget_is_split_and_generates_the_same(tiny_model_dir: Path, monkeypatch) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=4)

    async def body(engine: HFEngine):
        outs = await generate_all(engine, PROMPTS, sampling, "budget")
        return outs, engine.stats

    whole, whole_stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    monkeypatch.setattr(hf_prefill, "PREFILL_TOKENS", 12)  # lengths 3..8 padded: [3, 4] (8), [5, 6] (12), [7], [8]
    split, split_stats = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
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

    outs, forwards, cached = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _, _ = run(with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
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

    outs, counts = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, plain_counts = run(with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
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
        turn2 = await generate_all(engine, seconds + [fresh], sampling, "together")
        counts = {k: engine.stats[k] - before[k] for k in ("prefill_forwards", "prefill_tokens", "prefill_tokens_cached")}
        return turn1 + turn2, counts

    outs, counts = run(with_engine(tiny_model_dir, body, eos_token_ids=()))
    plain, _ = run(with_engine(tiny_model_dir, body, eos_token_ids=(), prefix_cache_min_tokens=0))
    cached = [len(p) + 6 - 1 for p in firsts]
    assert counts == {"prefill_forwards": 1, "prefill_tokens": (1 + 2) + (1 + 3) + len(fresh),
                      "prefill_tokens_cached": sum(cached)}
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    for out, ref in zip(outs, plain):
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
