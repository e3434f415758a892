"""On: the draft length per batch-size bucket that maximizes goodput(b, K) = b E(K) / c(b, K), the expected
accepted tokens per second. Each power-of-two bucket [lo, hi] is scored at its geometric midpoint
sqrt(lo * min(hi, max_batch_size)) (the open last bucket at its lo); ties go to the smaller K."""

from __future__ import annotations

import math
from collections.abc import Sequence

from opts.draft_length.acceptance import check_k, config_alphas, expected_tokens_curve
from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.cost import StepCost
from opts.draft_length.naive import off_schedule
from opts.draft_length.schedule import (
    MAX_BATCH_SIZE,
    MAX_NUM_SEQS,
    Schedule,
    buckets,
    fixed_schedule,
    merge_schedule,
)


def goodput(cost: StepCost, alphas: Sequence[float], batch: float, k: int) -> float:
    """Expected accepted tokens per second at `batch` sequences with `k` drafts: b E(K) / c(b, K)."""
    return batch * expected_tokens_curve(alphas, k)[k] / cost.seconds(batch, k)


def _candidates(ks: Sequence[int] | None, max_k: int | None, num_alphas: int) -> tuple[int, ...]:
    if ks is None:
        if max_k is None:
            raise ValueError("max_k: invalid value None; valid: an integer >= 0 when ks is not given")
        ks = range(check_k(max_k, "max_k") + 1)
    out = tuple(sorted({check_k(k, "ks[]") for k in ks}))
    if not out:
        raise ValueError(f"ks: invalid value {ks!r}; valid: at least one K >= 0")
    if out[-1] > num_alphas:
        raise ValueError(f"alphas: {num_alphas} rates cover K <= {num_alphas}, got K = {out[-1]}; "
                         "valid: at least max K rates")
    return out


def choose_k(cost: StepCost, alphas: Sequence[float], batch: float, ks: Sequence[int]) -> int:
    """The K in `ks` with the most goodput at `batch` (the smallest on ties)."""
    candidates = _candidates(ks, None, len(alphas))
    curve = expected_tokens_curve(alphas, candidates[-1])
    scores = [batch * curve[k] / cost.seconds(batch, k) for k in candidates]
    return candidates[scores.index(max(scores))]


def bucket_batch(lo: int, hi: int, max_batch_size: int) -> float:
    """Where a bucket is scored: the geometric midpoint of [lo, min(hi, max_batch_size)]."""
    return math.sqrt(lo * max(lo, min(hi, max_batch_size)))


def choose_schedule(cost: StepCost, alphas: Sequence[float], *, max_k: int | None = None,
                    ks: Sequence[int] | None = None, max_batch_size: int = MAX_BATCH_SIZE,
                    max_num_seqs: int = MAX_NUM_SEQS) -> Schedule:
    """[(lo, hi, K), ...]: each bucket's best K among `ks` (default 0..max_k), adjacent equal K merged."""
    candidates = _candidates(ks, max_k, len(alphas))
    entries = [(lo, hi, choose_k(cost, alphas, bucket_batch(lo, hi, max_batch_size), candidates))
               for lo, hi in buckets(max_batch_size, max_num_seqs)]
    return merge_schedule(entries)


def policy(config: DraftLengthConfig, *, max_batch_size: int = MAX_BATCH_SIZE,
           max_num_seqs: int = MAX_NUM_SEQS) -> Schedule:
    """The schedule a config runs: off `k` everywhere, k0 no drafts, on the chooser's (or `config.schedule`)."""
    if not isinstance(config, DraftLengthConfig):
        raise ValueError(f"config: expected a DraftLengthConfig, got {type(config).__name__}")
    if config.mode == "off":
        return off_schedule(config, max_num_seqs)
    if config.mode == "k0":
        return fixed_schedule(0, max_num_seqs)
    if config.schedule:
        return merge_schedule(config.schedule)
    return choose_schedule(StepCost.from_config(config), config_alphas(config, config.max_k), max_k=config.max_k,
                           max_batch_size=max_batch_size, max_num_seqs=max_num_seqs)
