"""Collation, token-budget micro-batches, balanced rank partitions, step plans."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainers.batching import (
    Sample,
    collate,
    dynamic_micro_batches,
    mini_batches_by_group,
    padded_micro_batches,
    plan_step,
    rank_partitions,
    samples_from_trajectories,
    shared_micro_batches,
)

from .conftest import make_trajectories

pytestmark = pytest.mark.unit

A = Sample(prompt_ids=(1, 2), response_ids=(3, 4, 5), response_mask=(1, 0, 1), rollout_logprobs=(-0.1, 0.0, -0.3),
           advantage=0.5, group_id="g")
B = Sample(prompt_ids=(6, 7, 8), response_ids=(9,), response_mask=(1,), rollout_logprobs=(-0.2,),
           advantage=-1.0, group_id="g")


C = Sample(prompt_ids=(10,), response_ids=(11,), response_mask=(1,), rollout_logprobs=(-0.4,), advantage=2.0,
           group_id="g")
B3 = Sample(prompt_ids=(6, 7), response_ids=(9,), response_mask=(1,), rollout_logprobs=(-0.2,), advantage=-1.0,
            group_id="g")


def test_collate_packed_layout():
    mb = collate([A, B3, C], packed=True)
    # Rows are 5 wide (A); B3 (3 tokens) and C (2) share the second row.
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 9, 10, 11]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert mb.attention_mask is None
    # A's response 3,4,5 sits at flat 2,3,4 → predicted at 1,2,3; B3's 9 at 7 → 6; C's 11 at 9 → 8.
    assert mb.pred_index.tolist() == [[1, 2, 3], [6, 0, 0], [8, 0, 0]]
    assert mb.valid.tolist() == [[True, True, True], [True, False, False], [True, False, False]]
    assert mb.labels.tolist() == [[3, 4, 5], [9, 0, 0], [11, 0, 0]]
    assert mb.response_mask.tolist() == [[1, 0, 1], [1, 0, 0], [1, 0, 0]]
    assert mb.advantages.tolist() == [[0.5, 0.5, 0.5], [-1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    assert mb.rollout_log_probs[0].tolist() == pytest.approx([-0.1, 0.0, -0.3])
    assert (mb.num_tokens, mb.padded_tokens) == (10, 10)


def test_collate_packed_row_tail_is_its_own_block():
    mb = collate([A, B], packed=True)  # 5 + 4 tokens do not fit one 5-wide row
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 0]]


def test_collate_padded_layout():
    mb = collate([A, B], packed=False)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]]
    assert mb.pred_index.tolist() == [[1, 2, 3], [7, 0, 0]]  # row 1 starts at flat index 5; 5 + 3 - 1 = 7
    assert (mb.num_tokens, mb.padded_tokens) == (9, 10)
    assert mb.old_log_probs is None


def test_collate_carries_recomputed_log_probs():
    a = replace(A, old_log_prob=torch.tensor([-1.0, -2.0, -3.0]))
    b = replace(B, old_log_prob=torch.tensor([-4.0]))
    assert collate([a, b], packed=True).old_log_probs.tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]


def test_response_over_budget_names_the_trajectory():
    traj = make_trajectories(1, 2, seed=0, max_response=24)
    with pytest.raises(ValueError, match="trajectory 'g0-"):
        samples_from_trajectories(traj, [0.0, 0.0], max_response_length=1)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=40), budget=st.integers(64, 256))
def test_dynamic_micro_batches_respect_the_token_budget(lengths, budget):
    parts = dynamic_micro_batches(lengths, budget)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p) <= budget for p in parts)


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=40), budget=st.integers(64, 256),
       min_count=st.integers(1, 8))
def test_padded_micro_batches_bound_padded_slots(lengths, budget, min_count):
    parts = padded_micro_batches(lengths, budget, min_count)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
    assert all(len(p) * max(lengths[i] for i in p) <= budget for p in parts)
    assert len(parts) >= min(min_count, len(lengths))


def test_padded_micro_batches_group_similar_lengths():
    # 4 long and 4 short rows, 200-token budget: longs pair up (2 × 100), shorts fill one batch (4 × 10).
    assert padded_micro_batches([100, 10, 100, 10, 100, 10, 100, 10], 200) == [[0, 2], [4, 6], [1, 3, 5, 7]]


def test_dynamic_micro_batches_reject_an_item_over_budget():
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=10"):
        dynamic_micro_batches([4, 11], 10)


def test_rank_partitions_are_balanced():
    rng = random.Random(0)
    lengths = [rng.choice([8, 16, 32, 400]) for _ in range(32)]
    parts = rank_partitions(lengths, 4)
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert sorted(i for p in parts for i in p) == list(range(32))
    assert [len(p) for p in parts] == [8, 8, 8, 8]
    # Karmarkar-Karp lands within one item of the mean; a round-robin split of this list does not.
    assert max(sums) - min(sums) <= max(lengths)
    robin = [sum(lengths[i::4]) for i in range(4)]
    assert max(sums) - min(sums) < max(robin) - min(robin)


def test_mini_batches_keep_groups_whole():
    gids = ["a", "a", "b", "b", "c", "c"]
    assert mini_batches_by_group(gids, 2, None) == [[0, 1, 2, 3], [4, 5]]
    shuffled = mini_batches_by_group(gids, 1, shuffle_seed=3)
    assert sorted(tuple(m) for m in shuffled) == [(0, 1), (2, 3), (4, 5)]


@pytest.mark.parametrize(("dynamic", "packed"), [(True, True), (True, False), (False, True)])
def test_every_rank_plans_the_same_number_of_micro_batches(dynamic, packed):
    trajs = make_trajectories(6, 4, seed=1)
    samples = samples_from_trajectories(trajs, [0.0] * len(trajs), 64)
    plans = [plan_step(samples, rank=r, world_size=3, groups_per_mini_batch=2, use_dynamic_bsz=dynamic,
                       micro_batch_size=2, max_token_len=48, packed=packed) for r in range(3)]
    assert len({len(p) for p in plans}) == 1 and len(plans[0]) == 3
    for mini in range(3):
        counts = {len(plans[r][mini].micro_batches) for r in range(3)}
        assert len(counts) == 1
        items = sorted(i for r in range(3) for mb in plans[r][mini].micro_batches for i in mb)
        assert items == list(range(mini * 8, mini * 8 + 8))  # 2 groups × 4, each on exactly one rank
        tokens = sum(sum(samples[i].response_mask) for i in items)
        assert plans[0][mini].info.batch_num_tokens == tokens
        mbs = [mb for r in range(3) for mb in plans[r][mini].micro_batches if mb]
        if dynamic and packed:
            assert all(sum(samples[i].length for i in mb) <= 48 for mb in mbs)
        if dynamic and not packed:
            assert all(len(mb) * max(samples[i].length for i in mb) <= 48 for mb in mbs)


def _group_samples(spec: list[tuple[int, int]], seed: int = 0) -> list[Sample]:
    """One sample per (prompt, response length) in ``spec``; samples with equal prompt numbers share a prompt."""
    rng = random.Random(seed)
    prompts = {p: tuple(rng.randrange(100) for _ in range(rng.randint(4, 12))) for p, _ in spec}
    return [Sample(prompts[p], tuple(range(1, r + 1)), (1,) * r, (0.0,) * r, 0.0, f"g{p}") for p, r in spec]


@settings(max_examples=40, deadline=None)
@given(spec=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20)), min_size=1, max_size=24),
       budget=st.integers(32, 128), min_count=st.integers(0, 6))
def test_shared_micro_batches_respect_the_budget_as_laid_out(spec, budget, min_count):
    from trainers.prefix import collate_shared

    samples = _group_samples(spec)
    parts = shared_micro_batches(samples, budget, min_count or None)
    assert sorted(i for p in parts for i in p) == list(range(len(samples)))
    assert all(collate_shared([samples[i] for i in p]).num_tokens <= budget for p in parts)
    assert len(parts) >= min(min_count, len(samples))


def test_shared_micro_batches_keep_a_group_together_when_it_fits():
    # Two groups of 4 with 10-token prompts and 5-token responses: 30 tokens each as laid out, 60 unshared.
    samples = _group_samples([(0, 5)] * 4 + [(1, 5)] * 4)
    samples = [replace(s, prompt_ids=tuple(range(10 * int(s.group_id[1]), 10 * int(s.group_id[1]) + 10)))
               for s in samples]
    assert shared_micro_batches(samples, 64) == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert sorted(shared_micro_batches(samples, 40)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(dynamic_micro_batches([s.length for s in samples], 64)) == 2  # unshared: 8 × 15 tokens
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu=12"):
        shared_micro_batches(samples, 12)


def test_fixed_micro_batches_with_shared_prompts_keep_groups_together():
    # A rank's share interleaves two groups; with shared prompts its micro-batches hold one prompt each.
    samples = _group_samples([(0, 3), (1, 3), (0, 4), (1, 4), (0, 5), (1, 5)])
    groups = [{samples[i].group_id for i in mb}
              for plan in plan_step(samples, rank=0, world_size=1, groups_per_mini_batch=2, use_dynamic_bsz=False,
                                    micro_batch_size=3, max_token_len=1000, share_prompts=True)
              for mb in plan.micro_batches]
    assert groups == [{"g0"}, {"g1"}]


@pytest.mark.parametrize("dynamic", [True, False])
def test_every_rank_plans_the_same_number_of_shared_micro_batches(dynamic):
    trajs = make_trajectories(6, 4, seed=1)
    samples = samples_from_trajectories(trajs, [0.0] * len(trajs), 64)
    plans = [plan_step(samples, rank=r, world_size=3, groups_per_mini_batch=2, use_dynamic_bsz=dynamic,
                       micro_batch_size=2, max_token_len=48, share_prompts=True) for r in range(3)]
    for mini in range(3):
        assert len({len(plans[r][mini].micro_batches) for r in range(3)}) == 1
        items = sorted(i for r in range(3) for mb in plans[r][mini].micro_batches for i in mb)
        assert items == list(range(mini * 8, mini * 8 + 8))
