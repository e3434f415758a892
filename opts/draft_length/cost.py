"""The step cost model: K draft passes of the MTP head over b tokens and one verify pass of width K+1 over b
sequences,

    c(b, K) = K (draft_pass_s + draft_token_s b + draft_expert_s F(b))
              + verify_pass_s + verify_token_s b (K + 1) + verify_expert_s F(b (K + 1))

F(t) = 1 - (1 - expert_fraction)^t is the expected share of routed experts that t tokens touch (each token picks
experts_per_token of num_experts, uniformly): a MoE pass reads the weights of the experts its tokens touch, which
grows with t until every expert is touched. With both expert terms 0 it is the linear model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from opts.draft_length.acceptance import check_k
from opts.draft_length.config import COST_FIELDS, DraftLengthConfig


def check_batch(batch, name: str = "batch") -> int:
    """`batch` as an int >= 1, else a ValueError naming `name` and the value."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{name}: invalid value {batch!r}; valid: an integer >= 1")
    return batch


def check_fraction(fraction, name: str = "expert_fraction") -> float:
    """`fraction` as a float in (0, 1], else a ValueError naming `name` and the value."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
        raise ValueError(f"{name}: invalid value {fraction!r}; valid: a share of experts in (0, 1]")
    return float(fraction)


@dataclass(frozen=True)
class StepCost:
    """Seconds per step: a fixed, a per-token and an all-experts part of one draft pass, and of the verify pass;
    `expert_fraction` (experts per token / experts) sets how fast tokens cover the experts."""

    draft_pass_s: float
    draft_token_s: float
    verify_pass_s: float
    verify_token_s: float
    draft_expert_s: float = 0.0
    verify_expert_s: float = 0.0
    expert_fraction: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "expert_fraction", check_fraction(self.expert_fraction, "StepCost.expert_fraction"))
        for name in COST_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value >= 0):
                raise ValueError(f"StepCost.{name}: invalid value {value!r}; valid: seconds >= 0, finite")
            object.__setattr__(self, name, float(value))
        verify = self.verify_pass_s + self.verify_token_s + self.verify_expert_s
        if verify <= 0:
            raise ValueError(f"StepCost.verify_pass_s + verify_token_s + verify_expert_s: invalid value {verify!r}; "
                             "valid: > 0 (a verify pass costs time)")

    @classmethod
    def from_config(cls, config: DraftLengthConfig) -> StepCost:
        """The cost model a config's coefficients describe."""
        return cls(**{name: getattr(config, name) for name in COST_FIELDS}, expert_fraction=config.expert_fraction)

    def seconds(self, batch: float, k: int) -> float:
        """c(b, K): seconds of one step of `batch` sequences with `k` drafts each (`batch` may be fractional)."""
        check_k(k)
        if isinstance(batch, bool) or not isinstance(batch, int | float) or not batch > 0:
            raise ValueError(f"batch: invalid value {batch!r}; valid: a batch size > 0")
        return sum(c * f for c, f in zip(self.coefficients(), features(batch, k, self.expert_fraction), strict=True))

    def coefficients(self) -> tuple[float, ...]:
        """The six coefficients in COST_FIELDS order."""
        return tuple(getattr(self, name) for name in COST_FIELDS)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def expert_share(tokens: float, expert_fraction: float) -> float:
    """F(t) = 1 - (1 - expert_fraction)^t: the expected share of routed experts `tokens` tokens touch."""
    return 1.0 - (1.0 - expert_fraction) ** tokens


def features(batch: float, k: int, expert_fraction: float = 1.0) -> tuple[float, ...]:
    """The model's regressors at (b, K), in COST_FIELDS order: K, K b, K F(b), 1, b (K + 1), F(b (K + 1))."""
    tokens = batch * (k + 1)
    return (float(k), float(k * batch), k * expert_share(batch, expert_fraction), 1.0, float(tokens),
            expert_share(tokens, expert_fraction))


LINEAR = tuple(i for i, name in enumerate(COST_FIELDS) if "expert" not in name)
VERIFY = tuple(i for i, name in enumerate(COST_FIELDS) if name.startswith("verify"))


def fit_step_cost(samples: Sequence[tuple[int, int, float]], *, expert_fraction: float | None = None) -> StepCost:
    """Least-squares fit of the coefficients (each >= 0) to measured (batch, K, seconds): the linear model's four
    when `expert_fraction` is None, else all six at that fraction. Minimises the relative error
    sum ((c(b, K) - t) / t)^2 so small and large steps count alike. Exact non-negative least squares: every
    subset of free coefficients is solved unconstrained; the best fit with no negative one wins."""
    rows = []
    for i, sample in enumerate(samples):
        if not (isinstance(sample, tuple | list) and len(sample) == 3):
            raise ValueError(f"samples[{i}]: invalid value {sample!r}; valid: (batch, K, seconds)")
        batch, k, seconds = sample
        check_batch(batch, f"samples[{i}].batch")
        check_k(k, f"samples[{i}].K")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"samples[{i}].seconds: invalid value {seconds!r}; valid: seconds > 0")
        rows.append((batch, k, float(seconds)))
    fraction = 1.0 if expert_fraction is None else check_fraction(expert_fraction)
    free = LINEAR if expert_fraction is None else tuple(range(len(COST_FIELDS)))
    if len({(b, k) for b, k, _ in rows}) < len(free):
        raise ValueError(f"samples: {len(rows)} samples at {len({(b, k) for b, k, _ in rows})} distinct (batch, K); "
                         f"valid: at least {len(free)} distinct (batch, K), with K > 0 and several batches")
    t = torch.tensor([s for _, _, s in rows], dtype=torch.float64)
    x = torch.tensor([features(b, k, fraction) for b, k, _ in rows], dtype=torch.float64) / t[:, None]
    y = torch.ones(len(rows), dtype=torch.float64)
    best, best_residual = None, math.inf
    for size in range(1, len(free) + 1):
        for support in itertools.combinations(free, size):
            solution = torch.linalg.lstsq(x[:, support], y[:, None]).solution[:, 0]
            if bool((solution < 0).any()):
                continue
            c = torch.zeros(len(COST_FIELDS), dtype=torch.float64)
            c[list(support)] = solution
            residual = float(((x @ c - y) ** 2).sum())
            if residual < best_residual and float(c[list(VERIFY)].sum()) > 0:
                best, best_residual = c, residual
    if best is None:
        raise ValueError("samples: no non-negative fit gives the verify pass a cost; valid: measured step times")
    return StepCost(**{name: float(v) for name, v in zip(COST_FIELDS, best, strict=True)}, expert_fraction=fraction)
