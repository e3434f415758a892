"""The chooser: obvious K in constructed cases, agreement with exhaustive search, buckets, the schedule form."""

import math
import random

import pytest

from opts.draft_length.acceptance import profile_alphas
from opts.draft_length.chooser import bucket_batch, choose_k, choose_schedule, goodput, policy
from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.cost import StepCost
from opts.draft_length.reference import best_k_exhaustive
from opts.draft_length.schedule import (
    MAX_NUM_SEQS,
    buckets,
    check_schedule,
    fixed_schedule,
    k_for_batch,
    merge_schedule,
)

FLAT = profile_alphas("flat", 8)
FREE_DRAFTS = StepCost(draft_pass_s=0.0, draft_token_s=0.0, verify_pass_s=1e-2, verify_token_s=0.0)
COSTLY_DRAFTS = StepCost(draft_pass_s=1.0, draft_token_s=1e-2, verify_pass_s=1e-2, verify_token_s=1e-4)
# a fixed cost that dominates small batches, a per-token cost that dominates large ones
MEMORY_THEN_COMPUTE = StepCost(draft_pass_s=1e-4, draft_token_s=1e-5, verify_pass_s=2e-2, verify_token_s=1e-4)


def test_goodput_by_hand():
    cost = StepCost(draft_pass_s=1e-3, draft_token_s=0.0, verify_pass_s=1e-2, verify_token_s=0.0)
    # K = 2, alpha = (0.8, 0.5): E = 2.2 tokens per sequence, 4 sequences, 12 ms per step
    assert goodput(cost, [0.8, 0.5], 4, 2) == pytest.approx(4 * 2.2 / 12e-3)
    assert goodput(cost, [0.8, 0.5], 4, 0) == pytest.approx(4 / 10e-3)


def test_free_drafts_take_max_k_everywhere():
    assert choose_schedule(FREE_DRAFTS, FLAT, max_k=8) == ((1, MAX_NUM_SEQS, 8),)
    assert choose_schedule(FREE_DRAFTS, FLAT, max_k=5) == ((1, MAX_NUM_SEQS, 5),)


def test_very_expensive_drafts_take_none():
    assert choose_schedule(COSTLY_DRAFTS, FLAT, max_k=8) == ((1, MAX_NUM_SEQS, 0),)


def test_drafts_that_are_never_accepted_are_not_worth_any_cost():
    tiny = StepCost(draft_pass_s=1e-9, draft_token_s=0.0, verify_pass_s=1e-2, verify_token_s=0.0)
    assert choose_schedule(tiny, [0.0] * 8, max_k=8) == ((1, MAX_NUM_SEQS, 0),)
    assert choose_schedule(tiny, [1.0] * 8, max_k=8) == ((1, MAX_NUM_SEQS, 8),)


def test_k_falls_as_the_batch_grows_from_memory_to_compute_bound():
    schedule = choose_schedule(MEMORY_THEN_COMPUTE, FLAT, max_k=8, max_batch_size=1024)
    ks = [k for _, _, k in schedule]
    assert ks == sorted(ks, reverse=True) and ks[0] >= 4 and ks[-1] <= 1
    assert check_schedule(schedule) == schedule


def test_choose_k_agrees_with_exhaustive_search():
    rng = random.Random(0)
    for _ in range(300):
        cost = StepCost(*(10 ** rng.uniform(-6, -2) for _ in range(4)), draft_expert_s=rng.uniform(0, 1e-2),
                        verify_expert_s=rng.uniform(0, 1e-2), expert_fraction=rng.uniform(0.01, 1))
        alphas = [rng.random() for _ in range(8)]
        batch, ks = rng.choice([1, 2, 5, 16, 64, 300]), sorted(rng.sample(range(9), rng.randint(1, 9)))
        assert choose_k(cost, alphas, batch, ks) == best_k_exhaustive(cost, alphas, batch, ks)


def test_ties_go_to_the_smaller_k():
    flat_cost = StepCost(draft_pass_s=0.0, draft_token_s=0.0, verify_pass_s=1.0, verify_token_s=0.0)
    assert choose_k(flat_cost, [0.0, 0.0], 4, [0, 1, 2]) == 0


def test_buckets_are_powers_of_two_with_an_open_last_one():
    assert buckets(32, 1024) == ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 1024))
    assert buckets(40, 256) == ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 256))
    assert buckets(1, 8) == ((1, 8),)
    assert bucket_batch(2, 3, 32) == pytest.approx(math.sqrt(6))
    assert bucket_batch(32, 1024, 32) == 32
    assert bucket_batch(1, 1, 32) == 1


def test_merge_joins_adjacent_equal_k_only():
    assert merge_schedule([(1, 1, 3), (2, 3, 3), (4, 7, 2), (8, 15, 3)]) == ((1, 3, 3), (4, 7, 2), (8, 15, 3))


def test_k_for_batch_follows_vllm_past_the_last_range():
    schedule = ((1, 3, 4), (4, 15, 2), (16, 31, 1))
    assert [k_for_batch(schedule, b) for b in (1, 3, 4, 15, 16, 31, 32, 5000)] == [4, 4, 2, 2, 1, 1, 1, 1]


def test_policy_per_mode():
    assert policy(DraftLengthConfig(mode="off", k=5)) == fixed_schedule(5) == ((1, MAX_NUM_SEQS, 5),)
    assert policy(DraftLengthConfig(mode="k0")) == ((1, MAX_NUM_SEQS, 0),)
    given = ((1, 7, 4), (8, 64, 1))
    assert policy(DraftLengthConfig(mode="on", schedule=given)) == given
    on = DraftLengthConfig(mode="on", max_k=6, draft_pass_s=1e-4, draft_token_s=1e-5, verify_pass_s=2e-2,
                           verify_token_s=1e-4)
    schedule = policy(on)
    assert schedule == choose_schedule(StepCost.from_config(on), FLAT[:6], max_k=6)
    assert max(k for _, _, k in schedule) <= 6 and schedule[0][0] == 1 and schedule[-1][1] == MAX_NUM_SEQS
    assert policy(DraftLengthConfig(mode="on"), max_num_seqs=300)[-1][1] == 300


@pytest.mark.parametrize(("schedule", "match"), [
    ([], r"schedule: invalid value \[\]; valid: a non-empty list"),
    ([(2, 3, 1)], r"schedule\[0\]: invalid value \[2, 3, 1\]; valid: lo = 1"),
    ([(1, 3, 1), (5, 6, 1)], r"schedule\[1\]: invalid value \[5, 6, 1\]; valid: lo = 4"),
    ([(1, 3, 1), (3, 6, 1)], r"schedule\[1\]: invalid value \[3, 6, 1\]; valid: lo = 4"),
    ([(1, 0, 1)], r"schedule\[0\]: invalid value \[1, 0, 1\]"),
    ([(1, 4, -1)], r"schedule\[0\]: invalid value \[1, 4, -1\]; .* K >= 0"),
    ([(1, 4.0, 1)], r"schedule\[0\]: invalid value \(1, 4.0, 1\); valid: \[lo, hi, K\] integers"),
    ([(1, 4)], r"schedule\[0\]: invalid value \(1, 4\)"),
    ([(True, 4, 1)], r"schedule\[0\]: invalid value"),
    ("1-4:3", r"schedule: invalid value '1-4:3'"),
])
def test_a_bad_schedule_is_an_error_naming_the_entry(schedule, match):
    with pytest.raises(ValueError, match=match):
        check_schedule(schedule)


def test_other_bad_input():
    with pytest.raises(ValueError, match=r"alphas: 3 rates cover K <= 3, got K = 8"):
        choose_schedule(FREE_DRAFTS, [0.8] * 3, max_k=8)
    with pytest.raises(ValueError, match=r"ks\[\]: invalid value -1"):
        choose_schedule(FREE_DRAFTS, FLAT, ks=[-1, 2])
    with pytest.raises(ValueError, match=r"ks: invalid value \[\]"):
        choose_schedule(FREE_DRAFTS, FLAT, ks=[])
    with pytest.raises(ValueError, match=r"max_num_seqs: invalid value 16; valid: >= max_batch_size \(32\)"):
        buckets(32, 16)
    with pytest.raises(ValueError, match=r"batch: invalid value 0"):
        k_for_batch(((1, 4, 2),), 0)
    with pytest.raises(ValueError, match=r"config: expected a DraftLengthConfig"):
        policy({"mode": "on"})
