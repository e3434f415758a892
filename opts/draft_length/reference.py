"""float64 references: E(K) by enumerating every accept/reject outcome, a seeded sampler of accepted drafts, the
best K per batch size by exhaustive search (the measured stack's MLA reference: `opts.k3.mla.expanded_attention`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from opts.draft_length.acceptance import check_k, check_rates
from opts.draft_length.cost import StepCost


def _covered(alphas: Sequence[float], k: int) -> tuple[float, ...]:
    check_k(k)
    rates = check_rates(alphas)
    if len(rates) < k:
        raise ValueError(f"alphas: {len(rates)} rates cover K <= {len(rates)}, got K = {k}; valid: at least K rates")
    return rates[:k]


def enumerated_expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(K) from all 2^K outcomes: position j would be accepted with probability alpha_j (independently); a step
    emits its accepted prefix plus one token. Exact in float64, for K up to about 20."""
    rates = _covered(alphas, k)
    total = 0.0
    for outcome in itertools.product((True, False), repeat=k):
        probability = 1.0
        for accepted, a in zip(outcome, rates, strict=True):
            probability *= a if accepted else 1.0 - a
        prefix = next((i for i, accepted in enumerate(outcome) if not accepted), k)
        total += probability * (1 + prefix)
    return total


def sample_accepted(alphas: Sequence[float], k: int, num: int, generator: torch.Generator) -> torch.Tensor:
    """`num` steps with `k` drafts each, drafts accepted at the conditional rates `alphas`: the number of accepted
    drafts per step (int64 [num], 0..k; the step emits that plus one token). Seeded by `generator`."""
    rates = _covered(alphas, k)
    check_k(num, "num")
    if num == 0 or k == 0:
        return torch.zeros(num, dtype=torch.int64)
    u = torch.rand(num, k, dtype=torch.float64, generator=generator)
    accepted = u < torch.tensor(rates, dtype=torch.float64)
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


def best_k_exhaustive(cost: StepCost, alphas: Sequence[float], batch: int, ks: Sequence[int]) -> int:
    """argmax over `ks` of batch * E(K) / c(batch, K) by direct evaluation (the smallest K on ties)."""
    best, best_value = -1, -1.0
    for k in sorted(ks):
        value = batch * enumerated_expected_tokens(alphas, k) / cost.seconds(batch, k)
        if value > best_value:
            best, best_value = k, value
    return best
