"""The closed form E(K) against enumeration of every outcome and against seeded sampling."""

import random

import pytest
import torch

from opts.draft_length.acceptance import expected_tokens, profile_alphas, to_cumulative
from opts.draft_length.reference import enumerated_expected_tokens, sample_accepted


def random_profiles(num: int, seed: int = 0):
    rng = random.Random(seed)
    return [[rng.random() for _ in range(rng.randint(1, 10))] for _ in range(num)]


@pytest.mark.parametrize("alphas", [*random_profiles(20), profile_alphas("flat", 10), profile_alphas("decaying", 10),
                                    [1.0] * 6, [0.0] * 4, [0.3, 1.0, 0.0, 1.0]])
def test_closed_form_equals_enumeration(alphas):
    for k in range(len(alphas) + 1):
        assert expected_tokens(alphas, k) == pytest.approx(enumerated_expected_tokens(alphas, k), rel=1e-12)


def test_enumeration_by_hand():
    # K = 2, alpha = (0.8, 0.5): 0 accepted w.p. 0.2, 1 w.p. 0.4, 2 w.p. 0.4 -> 1 + 0.4 + 0.8 = 2.2
    assert enumerated_expected_tokens([0.8, 0.5], 2) == pytest.approx(2.2, abs=1e-15)


@pytest.mark.parametrize(("profile", "k"), [("flat", 3), ("decaying", 8), ("flat", 8)])
def test_sampled_acceptance_matches_the_closed_form(profile, k):
    alphas = profile_alphas(profile, k)
    num = 200_000
    accepted = sample_accepted(alphas, k, num, torch.Generator().manual_seed(1)).double()
    mean, std = accepted.mean().item(), accepted.std().item()
    assert abs(1 + mean - expected_tokens(alphas, k)) < 4 * std / num ** 0.5
    for i, c in enumerate(to_cumulative(alphas), 1):   # P(at least i accepted) = c_i
        share = (accepted >= i).double().mean().item()
        assert abs(share - c) < 4 * (c * (1 - c) / num) ** 0.5 + 1e-12


def test_sampling_is_seeded_and_bounded():
    a = sample_accepted([0.8] * 5, 5, 1000, torch.Generator().manual_seed(7))
    b = sample_accepted([0.8] * 5, 5, 1000, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and a.dtype == torch.int64 and a.shape == (1000,)
    assert int(a.min()) >= 0 and int(a.max()) <= 5
    assert torch.equal(sample_accepted([0.8], 0, 4, torch.Generator()), torch.zeros(4, dtype=torch.int64))
    assert int(sample_accepted([1.0] * 3, 3, 50, torch.Generator()).min()) == 3
    assert int(sample_accepted([0.0] * 3, 3, 50, torch.Generator()).max()) == 0


def test_sampling_bad_input():
    with pytest.raises(ValueError, match=r"alphas\[0\]: invalid value 1.2"):
        sample_accepted([1.2], 1, 10, torch.Generator())
    with pytest.raises(ValueError, match=r"K: invalid value -1"):
        sample_accepted([0.5], -1, 10, torch.Generator())
    with pytest.raises(ValueError, match=r"num: invalid value -3"):
        sample_accepted([0.5], 1, -3, torch.Generator())
