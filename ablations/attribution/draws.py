"""Joint draws of the simulator's assumed figures, and the attribution's intervals over them.

A draw sets every ranged figure of the hardware profile (`HardwareConfig.ranges`: each assumed figure has one,
the reason in its source) to a value in its range. `latin_hypercube(ranges, num, seed)` stratifies each
figure's range into `num` equal slices and takes one value per slice, the slices paired across figures by a
seeded permutation each (McKay, Beckman and Conover, 1979): every figure's range is covered evenly with few
draws. A range collapsed to one value ([v, v]) draws v every time, so a design whose ranges are all collapsed
reproduces the plain run.

`summarize(values_by_draw, players)` turns each toggle's Shapley value per draw into its 5-95% interval,
P(value > 0) and how often it keeps the rank it has at the point values; a toggle whose interval spans 0 is not
resolved by the model.

`first_order(values_by_draw, figures_by_draw)` says which assumption matters: for each toggle and each drawn
figure, the share of the toggle's variance over the draws that the figure explains alone. It is the first-order
(Sobol) index of the linear fit, rho^2 (the squared Pearson correlation of the figure and the Shapley value over
the draws), which is exact for a value linear in independent figures; the Latin hypercube keeps the figures
nearly uncorrelated. A figure acting only through interactions or a non-monotone curve is under-read; with `n`
draws an index below about 4/n is within sampling noise of 0.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablations.hardware import HardwareConfig

LOW_Q, HIGH_Q = 0.05, 0.95


def latin_hypercube(ranges: Mapping[str, Sequence[float]], num: int, seed: int = 0) -> list[dict[str, float]]:
    """`num` joint draws over `ranges` ({key: [low, high]}), one per stratum of each key's range, each value at a
    seeded uniform position inside its stratum; keys in sorted order, so the draws do not depend on the mapping's
    order. A bad range or count is a ValueError naming it."""
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"draws: invalid value {num!r}; valid: an integer >= 1")
    rng = random.Random(seed)
    columns = {}
    for key in sorted(ranges):
        bounds = ranges[key]
        if len(bounds) != 2 or not bounds[0] <= bounds[1]:
            raise ValueError(f"ranges.{key}: invalid value {list(bounds)!r}; valid: [low, high] with low <= high")
        low, high = float(bounds[0]), float(bounds[1])
        strata = list(range(num))
        rng.shuffle(strata)
        columns[key] = [low if low == high else low + (high - low) * (s + rng.random()) / num for s in strata]
    return [{key: column[i] for key, column in columns.items()} for i in range(num)]


def apply_draw(hw: HardwareConfig, draw: Mapping[str, float]) -> HardwareConfig:
    """`hw` with every figure of `draw` set (`report.with_value`: an efficiency at most 1, a bus bandwidth at most
    the link's)."""
    from ablations.backends.sim.report import with_value

    for key, value in draw.items():
        hw = with_value(hw, key, value)
    return hw


@dataclass(frozen=True)
class Interval:
    """One toggle's Shapley value over the draws: at the point values, its 5-95% interval, P(> 0), how often it
    keeps its point rank, and each draw's value."""

    point: float
    low: float
    high: float
    p_positive: float
    rank_kept: float
    values: tuple[float, ...]

    @property
    def resolved(self) -> bool:
        """Whether the model decides its sign: the interval does not span 0."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, Any]:
        return {"point": self.point, "low": self.low, "high": self.high, "p_positive": self.p_positive,
                "rank_kept": self.rank_kept, "resolved": self.resolved, "values": list(self.values)}


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values`, linear between order statistics (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (pos - lo) * (ordered[hi] - ordered[lo])


def ranks(values: Mapping[str, float]) -> dict[str, int]:
    """Each toggle's rank by value, 1 the largest (ties by name)."""
    order = sorted(values, key=lambda p: (-values[p], p))
    return {p: i + 1 for i, p in enumerate(order)}


def summarize(point: Mapping[str, float], draws: Sequence[Mapping[str, float]]) -> dict[str, Interval]:
    """Each toggle's `Interval` from its Shapley value at the point values (`point`) and in every draw."""
    if not draws:
        raise ValueError("no draws to summarize")
    point_rank = ranks(point)
    draw_ranks = [ranks(d) for d in draws]
    out = {}
    for p in point:
        values = tuple(float(d[p]) for d in draws)
        out[p] = Interval(float(point[p]), quantile(values, LOW_Q), quantile(values, HIGH_Q),
                          sum(v > 0 for v in values) / len(values),
                          sum(r[p] == point_rank[p] for r in draw_ranks) / len(draws), values)
    return out


def table(intervals: Mapping[str, Interval], num_draws: int,
          indices: Mapping[str, Mapping[str, float]] | None = None, of: int | None = None) -> str:
    """The intervals as text: one line per toggle; one not resolved is said so, with the figure that moves it
    most (`indices`, `first_order`): measuring that one would resolve it first. `of`: the draws the sweep has,
    where only `num_draws` of them are complete."""
    count = f"{num_draws} of {of}" if of is not None and of != num_draws else f"{num_draws}"
    lines = [f"Shapley over {count} joint draws of the assumed figures (Latin hypercube), 5-95%:",
             f"{'toggle':<16}{'value':>11}{'5%':>11}{'95%':>11}{'P(>0)':>8}{'rank kept':>11}"]
    for p, iv in intervals.items():
        verdict = "" if iv.resolved else "  not resolved by the model"
        top = next(iter((indices or {}).get(p, {}).items()), None)
        if not iv.resolved and top is not None and top[1] > 0:
            verdict += f" (most moved by {top[0]}: rho^2 {top[1]:.2f})"
        lines.append(f"{p:<16}{iv.point:>11.4g}{iv.low:>11.4g}{iv.high:>11.4g}{iv.p_positive:>8.2f}"
                     f"{iv.rank_kept:>11.2f}{verdict}")
    return "\n".join(lines)



def first_order(values: Sequence[Mapping[str, float]], figures: Sequence[Mapping[str, float]]
                ) -> dict[str, dict[str, float]]:
    """{toggle: {figure: rho^2}}: each drawn figure's linear first-order index on each toggle's Shapley value, over
    the draws (`values[i]` the Shapley values of draw i, `figures[i]` its figures); figures sorted by index, the
    largest first. A figure (or a value) that does not vary over the draws explains nothing: 0."""
    if len(values) != len(figures):
        raise ValueError(f"first_order: {len(values)} draws of values, {len(figures)} of figures")
    if len(values) < 3:
        return {}
    out = {}
    for p in values[0]:
        ys = [float(v[p]) for v in values]
        indices = {key: _rho2([float(f[key]) for f in figures], ys) for key in sorted(figures[0])}
        out[p] = dict(sorted(indices.items(), key=lambda kv: (-kv[1], kv[0])))
    return out


def _rho2(xs: Sequence[float], ys: Sequence[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 1e-300 or syy <= 1e-300 * max(1.0, my * my):
        return 0.0
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return min(sxy * sxy / (sxx * syy), 1.0)


def indices_table(indices: Mapping[str, Mapping[str, float]], num_draws: int, top: int = 3) -> str:
    """Each toggle's `top` figures by first-order index, as text."""
    lines = [f"which assumption matters (first-order index rho^2 over {num_draws} draws; below ~{4 / num_draws:.2f} "
             "is noise):"]
    for p, by in indices.items():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in list(by.items())[:top])
        lines.append(f"  {p:<16}{shown}")
    return "\n".join(lines)
