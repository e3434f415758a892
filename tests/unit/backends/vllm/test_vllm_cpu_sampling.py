"""Synthetic rejection sampling (cpu/sampling.py) against vLLM.

vLLM's Triton kernels (v1/sample/rejection_sampler.py:726-780 greedy, :829-900 random) accept draft i of a
request with `uniform < rate[i]` (a negative draft id is rejected), emit the target's token at the first
rejection and stop, and append the bonus token when nothing was rejected. That is the random kernel's
test `target_prob / draft_prob >= uniform` with draft_prob 1 and target_prob[draft] = rate[i], so vLLM-CPU's
own C++ random kernel is the reference here (uniforms never equal a rate).
"""

from __future__ import annotations

import pytest
import torch

from ablations.backends.vllm.in_vllm.cpu import sampling

VOCAB, MAX_SPEC = 16, 3


def case(seed: int = 0):
    """Four requests with 3, 2, 0 and 3 drafts."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([3, 5, 5, 8], dtype=torch.int32)
    drafts = torch.randint(0, VOCAB, (8,), generator=g, dtype=torch.int32)
    uniform = torch.rand(8, generator=g, dtype=torch.float64)
    rates = torch.tensor([0.6, 0.7, 0.8])
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 1, 2])
    recovered = torch.randint(0, VOCAB, (8,), generator=g)
    bonus = torch.tensor([100, 200, 300, 400])
    return cu, drafts, uniform, rates, positions, recovered, bonus


def vllm_cpu_synthetic(cu, drafts, uniform, rates, positions, recovered, bonus, rows):
    """vLLM-CPU's C++ random rejection kernel with target_prob[draft] = rate: rows `rows` sampled."""
    from vllm.utils import cpu_triton_utils

    target_probs = torch.zeros(drafts.numel(), VOCAB)
    target_probs[torch.arange(drafts.numel()), drafts.long()] = rates[positions]
    out = torch.full((cu.numel(), MAX_SPEC + 1), -1, dtype=torch.int32)
    not_sampled = torch.ones(cu.numel(), dtype=torch.bool)
    not_sampled[rows] = False
    cpu_triton_utils._rejection_random_sample_kernel_impl(
        out, cu, drafts, None, target_probs, bonus, recovered, uniform, not_sampled, MAX_SPEC, VOCAB, None, True,
        False,
    )
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_synthetic_matches_vllm_cpu_kernel(vllm, seed):
    cu, drafts, uniform, rates, positions, recovered, bonus = case(seed)
    is_greedy = torch.tensor([False, True, False, False])
    want = vllm_cpu_synthetic(cu, drafts, uniform, rates, positions, recovered, bonus, [0, 2, 3])
    got = torch.full((4, MAX_SPEC + 1), -1, dtype=torch.int32)
    sampling.rejection_random_sample(got, cu, drafts, None, torch.zeros(8, VOCAB), bonus, recovered, uniform,
                                     is_greedy, MAX_SPEC, VOCAB, rates, NO_DRAFT_PROBS=True, SYNTHETIC_MODE=True)
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(4))
def test_greedy_synthetic_matches_vllm_cpu_kernel(vllm, seed):
    """Greedy rows fall back to the target argmax (the greedy kernel's recovered token)."""
    cu, drafts, uniform, rates, positions, target_argmax, bonus = case(seed)
    is_greedy = torch.tensor([True, True, False, True])
    want = vllm_cpu_synthetic(cu, drafts, uniform, rates, positions, target_argmax, bonus, [0, 1, 3])
    got = torch.full((4, MAX_SPEC + 1), -1, dtype=torch.int32)
    sampling.rejection_greedy_sample(got, cu, drafts, target_argmax, bonus, is_greedy, MAX_SPEC, uniform, rates,
                                     SYNTHETIC_MODE=True)
    assert got.tolist() == want.tolist()


def test_greedy_synthetic_without_flags_samples_every_row():
    """is_greedy None: every row is greedy (rejection_sampler.py:741)."""
    cu, drafts, _, rates, _, target_argmax, bonus = case()
    got = torch.full((4, MAX_SPEC + 1), -1, dtype=torch.int32)
    sampling.rejection_greedy_sample(got, cu, drafts, target_argmax, bonus, None, MAX_SPEC,
                                     torch.zeros(8, dtype=torch.float64), rates, SYNTHETIC_MODE=True)
    assert got[:, 0].tolist() == [int(drafts[0]), int(drafts[3]), 300, int(drafts[5])]
    assert got[0].tolist() == [*drafts[:3].tolist(), 100]


@pytest.mark.parametrize("greedy", [True, False])
def test_padded_drafts_are_rejected(greedy):
    """A draft id of -1 is rejected whatever the uniform (rejection_sampler.py:763, :864)."""
    cu, drafts = torch.tensor([3]), torch.tensor([5, -1, 7], dtype=torch.int32)
    uniform, rates = torch.zeros(3, dtype=torch.float64), torch.ones(3)
    fallback, bonus = torch.tensor([50, 51, 52]), torch.tensor([99])
    got = torch.full((1, MAX_SPEC + 1), -2, dtype=torch.int32)
    if greedy:
        sampling.rejection_greedy_sample(got, cu, drafts, fallback, bonus, None, MAX_SPEC, uniform, rates,
                                         SYNTHETIC_MODE=True)
    else:
        sampling.rejection_random_sample(got, cu, drafts, None, torch.zeros(3, 8), bonus, fallback, uniform,
                                         torch.tensor([False]), MAX_SPEC, 8, rates, NO_DRAFT_PROBS=True,
                                         SYNTHETIC_MODE=True)
    assert got.tolist() == [[5, 51, -2, -2]]


def test_non_synthetic_calls_go_to_vllm_cpu_kernels(vllm):
    """Plain greedy verification is vLLM-CPU's C++ kernel: draft == argmax accepted, else the argmax, then stop."""
    cu = torch.tensor([2, 4], dtype=torch.int32)
    drafts = torch.tensor([3, 4, 5, 6], dtype=torch.int32)
    target_argmax = torch.tensor([3, 4, 9, 6])
    got = torch.full((2, 3), -1, dtype=torch.int32)
    sampling.rejection_greedy_sample(got, cu, drafts, target_argmax, torch.tensor([10, 20]), None, 2)
    assert got.tolist() == [[3, 4, 10], [9, -1, -1]]
