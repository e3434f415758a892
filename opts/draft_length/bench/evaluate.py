"""Held-out evaluation of the chooser on measured steps.

The repeats are split: the cost model (its expert share from the stack's routing) is fitted to the per-cell medians
of the even repeats, and every goodput is
computed from the medians of the odd (held-out) repeats: goodput(b, K) = b E(K) / t(b, K). Per measured batch size
and acceptance profile: fixed K's goodput, the chosen K's, the best measured K in hindsight and the regret
1 - chosen / best. Noise: per cell |median(even) - median(odd)| / median(all); the run's noise is its 90th
percentile over the cells; a row's noise (where chosen and fixed K differ) is the larger of the run's and the sum
of its two cells' (how far apart the held-out comparison can land by timing alone)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from opts.draft_length.acceptance import check_k, expected_tokens_curve, profile_alphas
from opts.draft_length.bench.step_times import Measurements
from opts.draft_length.chooser import choose_schedule
from opts.draft_length.config import PROFILES
from opts.draft_length.cost import StepCost, fit_step_cost
from opts.draft_length.schedule import Schedule, buckets, k_for_batch

NOISE_QUANTILE = 0.9


@dataclass(frozen=True)
class Row:
    """One measured batch size under one profile, goodput in accepted tokens per second (held-out repeats)."""

    profile: str
    bucket: tuple[int, int]
    batch: int
    fixed_k: int
    fixed_goodput: float
    chosen_k: int
    chosen_goodput: float
    best_k: int
    best_goodput: float
    noise: float

    @property
    def regret(self) -> float:
        """1 - chosen / best in hindsight."""
        return 1.0 - self.chosen_goodput / self.best_goodput

    @property
    def loss_vs_fixed(self) -> float:
        """1 - chosen / fixed: > 0 where the chosen K loses to fixed K."""
        return 1.0 - self.chosen_goodput / self.fixed_goodput

    @property
    def is_within_noise(self) -> bool:
        """Whether chosen K loses to fixed K by no more than the two cells' noise."""
        return self.loss_vs_fixed <= self.noise

    def to_dict(self) -> dict:
        return {**asdict(self), "bucket": list(self.bucket), "regret": self.regret,
                "loss_vs_fixed": self.loss_vs_fixed, "is_within_noise": self.is_within_noise}


@dataclass(frozen=True)
class Evaluation:
    """The fitted cost model, each profile's schedule, the rows, the noise, and the held-out error of the model and of
    the linear model (no expert terms) fitted to the same data."""

    cost: StepCost
    schedules: dict[str, Schedule]
    rows: tuple[Row, ...]
    cell_noise: dict[tuple[int, int], float]
    noise: float
    fit_error: dict[str, float]

    def to_dict(self) -> dict:
        return {"cost_fit": self.cost.to_dict(), "noise": self.noise, "noise_quantile": NOISE_QUANTILE,
                "fit_error": self.fit_error,
                "schedules": {p: [list(e) for e in s] for p, s in self.schedules.items()},
                "cell_noise": [{"batch": b, "k": k, "noise": v} for (b, k), v in self.cell_noise.items()],
                "rows": [r.to_dict() for r in self.rows]}


def split_repeats(repeats: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(fit repeats, held-out repeats): the even and the odd ones."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"repeats: invalid value {repeats!r}; valid: an integer >= 2 (half fit, half held out)")
    return tuple(range(0, repeats, 2)), tuple(range(1, repeats, 2))


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def evaluate(measurements: Measurements, *, fixed_k: int = 3, profiles: Sequence[str] = PROFILES) -> Evaluation:
    """Fit on the even repeats, choose K per bucket for each profile, score fixed and chosen K on the odd ones."""
    m = measurements
    check_k(fixed_k, "fixed_k")
    if fixed_k not in m.ks:
        raise ValueError(f"fixed_k: invalid value {fixed_k!r}; valid: a measured K ({', '.join(map(str, m.ks))})")
    fit, held = split_repeats(m.repeats)
    cells = [(b, k) for b in m.batch_sizes for k in m.ks]
    fit_s = [(b, k, m.median(b, k, fit)) for b, k in cells]
    cost = fit_step_cost(fit_s, expert_fraction=m.shape.spec.experts_per_token / m.shape.spec.num_experts)
    held_s = {cell: m.median(*cell, held) for cell in cells}
    cell_noise = {cell: abs(m.median(*cell, fit) - held_s[cell]) / m.median(*cell) for cell in cells}
    run_noise = quantile(list(cell_noise.values()), NOISE_QUANTILE)
    max_batch = max(m.batch_sizes)
    schedules, rows = {}, []
    for profile in profiles:
        curve = expected_tokens_curve(profile_alphas(profile, max(m.ks)), max(m.ks))
        schedule = choose_schedule(cost, profile_alphas(profile, max(m.ks)), ks=m.ks, max_batch_size=max_batch)
        schedules[profile] = schedule
        for b in m.batch_sizes:
            good = {k: b * curve[k] / held_s[(b, k)] for k in m.ks}
            best = max(m.ks, key=lambda k: (good[k], -k))
            chosen = k_for_batch(schedule, b)
            bucket = next((lo, hi) for lo, hi in buckets(max_batch) if lo <= b <= hi)
            noise = 0.0 if chosen == fixed_k else max(run_noise, cell_noise[(b, chosen)] + cell_noise[(b, fixed_k)])
            rows.append(Row(profile, bucket, b, fixed_k, good[fixed_k], chosen, good[chosen], best, good[best], noise))
    return Evaluation(cost, schedules, tuple(rows), cell_noise, run_noise,
                      {"model": _errors(cost, held_s), "linear_model": _errors(fit_step_cost(fit_s), held_s)})


def _errors(cost: StepCost, seconds: dict[tuple[int, int], float]) -> dict[str, float]:
    errors = [abs(cost.seconds(b, k) / t - 1) for (b, k), t in seconds.items()]
    return {"max": max(errors), "rms": math.sqrt(statistics.fmean(e * e for e in errors))}


def table(evaluation: Evaluation) -> str:
    """The rows as a markdown table per profile (goodput in accepted tokens/s)."""
    lines = []
    for profile, schedule in evaluation.schedules.items():
        rows = [r for r in evaluation.rows if r.profile == profile]
        lines += [f"profile {profile}: schedule {[list(e) for e in schedule]}",
                  f"| bucket | b | fixed K={rows[0].fixed_k} tok/s | chosen K | chosen tok/s | best K | best tok/s "
                  "| regret | chosen vs fixed | noise |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| [{r.bucket[0]}, {r.bucket[1]}] | {r.batch} | {r.fixed_goodput:.1f} | {r.chosen_k} | "
                  f"{r.chosen_goodput:.1f} | {r.best_k} | {r.best_goodput:.1f} | {r.regret:.1%} | "
                  f"{-r.loss_vs_fixed:+.1%} | {r.noise:.1%} |" for r in rows]
        lines.append("")
    model, linear = evaluation.fit_error["model"], evaluation.fit_error["linear_model"]
    lines.append(f"noise (p{NOISE_QUANTILE * 100:.0f} of |median(even) - median(odd)| / median per cell): "
                 f"{evaluation.noise:.1%}; cost model vs held-out medians: max {model['max']:.1%}, rms "
                 f"{model['rms']:.1%} (linear model, no expert terms: max {linear['max']:.1%}, "
                 f"rms {linear['rms']:.1%})")
    lines.append("fit: " + " ".join(f"{n}={v:.3e}" for n, v in evaluation.cost.to_dict().items()))
    return "\n".join(lines)
