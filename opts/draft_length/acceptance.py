"""The acceptance model: per-position conditional acceptance rates alpha_j and the expected tokens per step.

alpha_j is the probability that draft j is accepted given drafts 1..j-1 were. A step with K drafts emits
the accepted prefix plus one token sampled by the target (the correction or the bonus token), so

    E(K) = 1 + sum_{i=1..K} prod_{j=1..i} alpha_j          (E(0) = 1)

vLLM's per-position rates are cumulative (unconditional): c_i = P(drafts 1..i all accepted) = prod_{j<=i}
alpha_j (`synthetic_acceptance_rates`; `vllm bench serve`'s per-position acceptance rates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from opts.draft_length.config import PROFILES, DraftLengthConfig

FLAT_ALPHA = 0.8
DECAYING_FIRST, DECAYING_RATIO = 0.9, 0.85
# A cumulative rate may exceed the previous one by this much (float rounding of a product) and still count as equal.
RISE_TOLERANCE = 1e-12


def check_k(k, name: str = "K") -> int:
    """`k` as an int >= 0, else a ValueError naming `name` and the value."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"{name}: invalid value {k!r}; valid: an integer >= 0")
    return k


def check_rates(rates: Sequence[float], name: str = "alphas") -> tuple[float, ...]:
    """`rates` as a tuple of floats, each finite and in [0, 1], else a ValueError naming `name[i]` and the value."""
    if isinstance(rates, str) or not isinstance(rates, Sequence):
        raise ValueError(f"{name}: invalid value {rates!r}; valid: a sequence of rates in [0, 1]")
    out = []
    for i, r in enumerate(rates):
        if isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r) or not 0 <= r <= 1:
            raise ValueError(f"{name}[{i}]: invalid value {r!r}; valid: a rate in [0, 1]")
        out.append(float(r))
    return tuple(out)


def _check_covers(alphas: tuple[float, ...], k: int, name: str) -> None:
    if len(alphas) < k:
        raise ValueError(f"{name}: {len(alphas)} rates cover K <= {len(alphas)}, got K = {k}; "
                         f"valid: at least K rates")


def profile_alphas(profile: str, k: int) -> tuple[float, ...]:
    """The first `k` conditional rates of a named profile: "flat" alpha_j = 0.8, "decaying" 0.9 * 0.85^(j-1)."""
    check_k(k)
    if profile == "flat":
        return (FLAT_ALPHA,) * k
    if profile == "decaying":
        return tuple(DECAYING_FIRST * DECAYING_RATIO ** j for j in range(k))
    raise ValueError(f"profile: invalid value {profile!r}; valid: {', '.join(PROFILES)}")


def config_alphas(config: DraftLengthConfig, k: int) -> tuple[float, ...]:
    """The first `k` conditional rates `config` describes: its `alphas` when given (at least `k` of them), else
    its profile's."""
    check_k(k)
    if not config.alphas:
        return profile_alphas(config.profile, k)
    alphas = check_rates(config.alphas, "DraftLengthConfig.alphas")
    _check_covers(alphas, k, "DraftLengthConfig.alphas")
    return alphas[:k]


def to_cumulative(alphas: Sequence[float]) -> tuple[float, ...]:
    """Conditional rates -> cumulative: c_i = prod_{j<=i} alpha_j (what vLLM's synthetic sampling takes)."""
    out, product = [], 1.0
    for a in check_rates(alphas):
        product *= a
        out.append(product)
    return tuple(out)


def to_conditional(cumulative: Sequence[float]) -> tuple[float, ...]:
    """Cumulative rates -> conditional: alpha_1 = c_1, alpha_j = c_j / c_{j-1}. Where c_{j-1} = 0 no step
    reaches draft j; alpha_j is then defined as 0 (any value gives the same E(K) and the same cumulative rates).
    A rate that rises (c_j > c_{j-1}) is a ValueError: a prefix cannot be accepted more often than a shorter one."""
    rates = check_rates(cumulative, "cumulative")
    out, previous = [], 1.0
    for i, c in enumerate(rates):
        if c > previous + RISE_TOLERANCE:
            raise ValueError(f"cumulative[{i}]: invalid value {c!r}; valid: <= cumulative[{i - 1}] = {previous!r} "
                             "(cumulative rates never rise)")
        out.append(0.0 if previous == 0 else min(1.0, c / previous))
        previous = c
    return tuple(out)


def alphas_from_counts(accepted_per_pos: Sequence[float], num_drafts: float) -> tuple[float, ...]:
    """Conditional rates from vLLM's counters: `accepted_per_pos[i]` (`vllm:spec_decode_num_accepted_tokens_per_pos`,
    position i+1) counts the steps whose drafts 1..i+1 were all accepted, out of `num_drafts` steps
    (`vllm:spec_decode_num_drafts`), so c_i = count_i / num_drafts is cumulative; a count above `num_drafts` or
    above the previous position's is a ValueError naming the position."""
    if isinstance(num_drafts, bool) or not isinstance(num_drafts, int | float) or not num_drafts > 0:
        raise ValueError(f"num_drafts: invalid value {num_drafts!r}; valid: a count > 0")
    counts = list(accepted_per_pos)
    for i, c in enumerate(counts):
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 <= c <= num_drafts:
            raise ValueError(f"accepted_per_pos[{i}]: invalid value {c!r}; valid: a count in [0, num_drafts = "
                             f"{num_drafts}]")
    return to_conditional([c / num_drafts for c in counts])


def expected_tokens(alphas: Sequence[float], k: int) -> float:
    """E(K) = 1 + sum_{i<=K} prod_{j<=i} alpha_j: expected tokens a step with `k` drafts emits."""
    check_k(k)
    rates = check_rates(alphas)
    _check_covers(rates, k, "alphas")
    return 1.0 + sum(to_cumulative(rates[:k]))


def expected_tokens_curve(alphas: Sequence[float], max_k: int) -> tuple[float, ...]:
    """(E(0), E(1), ..., E(max_k))."""
    check_k(max_k, "max_k")
    rates = check_rates(alphas)
    _check_covers(rates, max_k, "alphas")
    curve = [1.0]
    for c in to_cumulative(rates[:max_k]):
        curve.append(curve[-1] + c)
    return tuple(curve)


def alphas_from_lengths(lengths: Sequence[float], *, project: bool = False) -> tuple[float, ...]:
    """Conditional rates from mean acceptance lengths L(1), L(2), ... measured at K = 1, 2, ... (L(0) = 1):
    prod_{j<=i} alpha_j = L(i) - L(i-1).

    The differences must be cumulative rates: in [0, 1] and non-increasing. Noisy lengths that break this are a
    ValueError naming the first bad one, or, with `project`, are projected: the differences are replaced by
    their least-squares non-increasing fit (pool-adjacent-violators) clipped to [0, 1]."""
    if isinstance(lengths, str) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"lengths: invalid value {lengths!r}; valid: mean acceptance lengths at K = 1, 2, ...")
    values = []
    for i, v in enumerate(lengths):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"lengths[{i}]: invalid value {v!r}; valid: a mean acceptance length in [1, {i + 2}]")
        values.append(float(v))
    diffs = [b - a for a, b in zip([1.0, *values[:-1]], values, strict=True)]
    if project:
        return to_conditional(tuple(min(1.0, max(0.0, d)) for d in _non_increasing_fit(diffs)))
    for i, d in enumerate(diffs):
        previous = 1.0 if i == 0 else diffs[i - 1]
        if not 0 <= d <= previous + RISE_TOLERANCE:
            raise ValueError(f"lengths[{i}]: invalid value {values[i]!r}; valid: L({i}) + [0, {previous:.6g}] = "
                             f"[{values[i] - d:.6g}, {values[i] - d + previous:.6g}] (each draft adds at most what "
                             "the previous one added; pass project=True to fit noisy lengths)")
    return to_conditional(tuple(min(1.0, d) for d in diffs))


def _non_increasing_fit(values: list[float]) -> list[float]:
    """The least-squares non-increasing sequence closest to `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []   # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count),
                          blocks[-1][1] + count]
    return [mean for mean, count in blocks for _ in range(int(count))]
