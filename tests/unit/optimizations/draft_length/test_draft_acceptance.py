"""The acceptance model: E(K) by hand, cumulative <-> conditional rates, rates from mean acceptance lengths."""

import math

import pytest

from opts.draft_length.acceptance import (
    alphas_from_counts,
    alphas_from_lengths,
    config_alphas,
    expected_tokens,
    expected_tokens_curve,
    profile_alphas,
    to_conditional,
    to_cumulative,
)
from opts.draft_length.config import DraftLengthConfig

# (conditional alphas, K, E(K) written out by hand)
HAND = [
    ([0.8, 0.5], 0, 1.0),
    ([0.8, 0.5], 1, 1.8),
    ([0.8, 0.5], 2, 1 + 0.8 + 0.4),
    ([0.8, 0.8, 0.8], 3, 1 + 0.8 + 0.64 + 0.512),
    ([1.0, 1.0, 1.0], 3, 4.0),
    ([0.0, 0.9, 0.9], 3, 1.0),
    ([0.5, 1.0, 0.2], 3, 1 + 0.5 + 0.5 + 0.1),
    ([0.9, 0.765, 0.65025], 3, 1 + 0.9 + 0.6885 + 0.447697125),
    ([0.6, 0.5, 0.4, 0.3], 2, 1 + 0.6 + 0.3),
]


@pytest.mark.parametrize(("alphas", "k", "expected"), HAND)
def test_expected_tokens_by_hand(alphas, k, expected):
    assert expected_tokens(alphas, k) == pytest.approx(expected, abs=1e-12)
    assert expected_tokens_curve(alphas, k)[k] == pytest.approx(expected, abs=1e-12)


def test_the_curve_starts_at_one_and_adds_each_cumulative_rate():
    assert expected_tokens_curve([0.8, 0.5, 0.5], 3) == pytest.approx((1.0, 1.8, 2.2, 2.4))
    assert expected_tokens_curve([], 0) == (1.0,)


def test_profiles_by_hand_and_extended_to_any_k():
    assert profile_alphas("flat", 4) == (0.8, 0.8, 0.8, 0.8)
    assert profile_alphas("decaying", 3) == pytest.approx((0.9, 0.765, 0.65025))
    long = profile_alphas("decaying", 40)
    assert len(long) == 40 and long[39] == pytest.approx(0.9 * 0.85 ** 39)
    assert profile_alphas("flat", 0) == ()
    assert expected_tokens(profile_alphas("flat", 3), 3) == pytest.approx(2.952)


@pytest.mark.parametrize(("cumulative", "conditional"), [
    ([0.8, 0.4], [0.8, 0.5]),
    ([0.9, 0.6885, 0.447697125], [0.9, 0.765, 0.65025]),
    ([0.5, 0.5, 0.25], [0.5, 1.0, 0.5]),
    ([0.5, 0.0, 0.0], [0.5, 0.0, 0.0]),   # nothing reaches draft 3: its rate is defined as 0
    ([0.0, 0.0], [0.0, 0.0]),
    ([], []),
])
def test_cumulative_and_conditional_by_hand_both_ways(cumulative, conditional):
    assert to_conditional(cumulative) == pytest.approx(tuple(conditional))
    assert to_cumulative(conditional) == pytest.approx(tuple(cumulative))


def test_round_trip_on_random_rates():
    import random

    rng = random.Random(0)
    for _ in range(200):
        alphas = [rng.random() for _ in range(rng.randint(1, 10))]
        assert to_conditional(to_cumulative(alphas)) == pytest.approx(tuple(alphas), rel=1e-9, abs=1e-12)


def test_a_rising_cumulative_rate_is_an_error():
    with pytest.raises(ValueError, match=r"cumulative\[1\]: invalid value 0.6; valid: <= cumulative\[0\] = 0.5"):
        to_conditional([0.5, 0.6])


@pytest.mark.parametrize(("lengths", "alphas"), [
    ([1.8, 2.2], [0.8, 0.5]),
    ([1.9, 2.5885, 3.036197125], [0.9, 0.765, 0.65025]),
    ([2.0, 3.0, 3.0], [1.0, 1.0, 0.0]),
    ([1.0, 1.0], [0.0, 0.0]),
])
def test_rates_from_mean_acceptance_lengths_by_hand(lengths, alphas):
    assert alphas_from_lengths(lengths) == pytest.approx(tuple(alphas))
    assert [expected_tokens(alphas_from_lengths(lengths), k + 1) for k in range(len(lengths))] == pytest.approx(
        lengths)


@pytest.mark.parametrize(("lengths", "index"), [
    ([1.8, 2.7], 1),    # the second draft adds 0.9 > the first's 0.8
    ([1.8, 1.7], 1),    # a longer draft lowers the mean length
    ([0.9], 0),         # below 1 token per step
    ([2.1], 0),         # one draft adds more than one token
])
def test_noisy_lengths_are_an_error_naming_the_bad_one(lengths, index):
    with pytest.raises(ValueError, match=rf"lengths\[{index}\]: invalid value {lengths[index]!r}; valid:"):
        alphas_from_lengths(lengths)


def test_noisy_lengths_are_projected_when_asked():
    # differences 0.8, 0.9 rise: pooled to 0.85, 0.85 -> alpha 0.85, 1.0
    assert alphas_from_lengths([1.8, 2.7], project=True) == pytest.approx((0.85, 1.0))
    # differences 0.8, -0.1: clipped to 0.8, 0 -> alpha 0.8, 0
    assert alphas_from_lengths([1.8, 1.7], project=True) == pytest.approx((0.8, 0.0))
    # differences 0.5, 0.7, 0.2: the first two pooled to 0.6 -> cumulative 0.6, 0.6, 0.2
    assert alphas_from_lengths([1.5, 2.2, 2.4], project=True) == pytest.approx((0.6, 1.0, 1 / 3))
    assert alphas_from_lengths([2.5], project=True) == (1.0,)


def test_config_alphas_take_the_explicit_rates_or_the_profile():
    assert config_alphas(DraftLengthConfig(profile="decaying"), 2) == pytest.approx((0.9, 0.765))
    assert config_alphas(DraftLengthConfig(alphas=(0.7, 0.6, 0.5), max_k=3), 2) == (0.7, 0.6)
    with pytest.raises(ValueError, match=r"DraftLengthConfig.alphas: 2 rates cover K <= 2, got K = 3"):
        config_alphas(DraftLengthConfig(alphas=(0.7, 0.6)), 3)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, math.inf, True, "0.5", None])
def test_a_rate_outside_zero_one_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match=rf"alphas\[1\]: invalid value {bad!r}; valid: a rate in \[0, 1\]"):
        expected_tokens([0.5, bad], 1)
    with pytest.raises(ValueError, match=r"alphas\[1\]: invalid value"):
        to_cumulative([0.5, bad])
    with pytest.raises(ValueError, match=r"cumulative\[1\]: invalid value"):
        to_conditional([0.5, bad])


@pytest.mark.parametrize("k", [-1, -5, 1.0, True, "2"])
def test_a_bad_k_is_an_error_naming_it(k):
    with pytest.raises(ValueError, match=rf"K: invalid value {k!r}; valid: an integer >= 0"):
        expected_tokens([0.5, 0.5], k)
    with pytest.raises(ValueError, match=r"K: invalid value"):
        profile_alphas("flat", k)


def test_too_few_rates_for_k_and_bad_profiles_are_errors():
    with pytest.raises(ValueError, match=r"alphas: 2 rates cover K <= 2, got K = 3"):
        expected_tokens([0.5, 0.5], 3)
    with pytest.raises(ValueError, match=r"profile: invalid value 'steep'; valid: flat, decaying"):
        profile_alphas("steep", 2)
    with pytest.raises(ValueError, match=r"alphas: invalid value 0.5"):
        expected_tokens(0.5, 1)


def test_vllm_per_position_counts_are_cumulative():
    """100 steps with 3 drafts: 80 accepted draft 1, 60 drafts 1-2, 30 all three (vLLM's per-position counters)."""
    assert alphas_from_counts([80, 60, 30], 100) == pytest.approx((0.8, 0.75, 0.5))
    assert to_cumulative(alphas_from_counts([80, 60, 30], 100)) == pytest.approx((0.8, 0.6, 0.3))
    assert alphas_from_counts([0, 0], 5) == (0.0, 0.0)


@pytest.mark.parametrize(("counts", "drafts", "message"), [
    ([120], 100, r"accepted_per_pos\[0\]: invalid value 120; valid: a count in \[0, num_drafts = 100\]"),
    ([-1], 100, r"accepted_per_pos\[0\]: invalid value -1"),
    ([10, 20], 100, r"cumulative"),
    ([1], 0, r"num_drafts: invalid value 0"),
])
def test_bad_counts_are_named(counts, drafts, message):
    with pytest.raises(ValueError, match=message):
        alphas_from_counts(counts, drafts)
