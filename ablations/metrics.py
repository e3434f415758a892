"""Every serving metric of the project, defined once, computed from per-request records.

Definitions (DESIGN.md "Metrics"):
- total throughput per GPU = (Σ input tokens + Σ output tokens) / (last end − first start) / num GPUs,
  input tokens counted even when served from cache; over a steady-state window (see `steady_window`).
- TPOT (per-request decode time per token) = (e2e − TTFT) / (output tokens − 1);
  P90 interactivity = 1 / p90(TPOT) tokens/s/user.
- throughput at an interactivity SLO: interpolated on the (interactivity, throughput/GPU) frontier of a
  concurrency sweep, never extrapolated (`throughput_at_slo`).
- tokens per dollar = throughput/GPU × 3600 / price per GPU-hour.
- achieved prefix-cache hit rate = Σ cached input tokens / Σ input tokens.
- theoretical prefix reuse of a trace = fraction of prompt blocks an unbounded cache would serve with
  leading-block prefix matching (`theoretical_prefix_reuse`; the trie walk is in ablations.workload.reuse).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ablations.workload.reuse import reuse_summary, served_blocks
from ablations.workload.trace import Trace

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, times in seconds on one clock."""

    arrival_s: float
    first_token_s: float
    finish_s: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "cached_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"RequestRecord.{name}: must be >= 0, got {getattr(self, name)}")
        if self.output_tokens < 1:
            raise ValueError(f"RequestRecord.output_tokens: a finished request has >= 1, got {self.output_tokens}")
        if self.cached_tokens > self.input_tokens:
            raise ValueError(
                f"RequestRecord.cached_tokens: {self.cached_tokens} exceeds input_tokens {self.input_tokens}"
            )
        if not self.arrival_s <= self.first_token_s <= self.finish_s:
            raise ValueError(
                "RequestRecord: times must satisfy arrival_s <= first_token_s <= finish_s, got "
                f"{self.arrival_s}, {self.first_token_s}, {self.finish_s}"
            )

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Per-request decode time per token; None for a single-token answer (no decode interval)."""
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Window:
    """The steady-state measurement window [start_s, end_s]."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if not self.end_s > self.start_s:
            raise ValueError(f"Window: end_s ({self.end_s}) must be after start_s ({self.start_s})")

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def full_window(records: Sequence[RequestRecord]) -> Window:
    """From the first arrival to the last finish: the window of DESIGN's plain formula."""
    _require(records)
    return Window(min(r.arrival_s for r in records), max(r.finish_s for r in records))


def steady_window(records: Sequence[RequestRecord], warmup_fraction: float = 0.1,
                  drain_fraction: float = 0.1) -> Window:
    """Skip the warm-up and the drain: start at the arrival of the first request after the first
    `warmup_fraction` of arrivals, end at the finish of the last request before the last
    `drain_fraction` of finishes. (0, 0) gives `full_window`."""
    _require(records)
    for name, value in (("warmup_fraction", warmup_fraction), ("drain_fraction", drain_fraction)):
        if not 0 <= value < 1:
            raise ValueError(f"steady_window: {name} must be in [0, 1), got {value}")
    arrivals = sorted(r.arrival_s for r in records)
    finishes = sorted(r.finish_s for r in records)
    n = len(records)
    start = arrivals[min(int(warmup_fraction * n), n - 1)]
    end = finishes[max(math.ceil((1 - drain_fraction) * n) - 1, 0)]
    if end <= start:
        raise ValueError(
            f"steady_window: warm-up {warmup_fraction} and drain {drain_fraction} leave no window "
            f"({n} requests, start {start:.3f} s, end {end:.3f} s); use smaller fractions or more requests"
        )
    return Window(start, end)


def tokens_in_window(records: Sequence[RequestRecord], window: Window) -> float:
    """Tokens attributed to the window: a request's input tokens and first output token at its first
    token, its other output tokens spread evenly over (first token, finish]. Over `full_window` this is
    exactly Σ input + Σ output."""
    total = 0.0
    for r in records:
        if window.start_s <= r.first_token_s <= window.end_s:
            total += r.input_tokens + 1
        rest = r.output_tokens - 1
        if rest:
            span = r.finish_s - r.first_token_s
            if span <= 0:
                total += rest if window.start_s <= r.finish_s <= window.end_s else 0
            else:
                overlap = min(r.finish_s, window.end_s) - max(r.first_token_s, window.start_s)
                total += rest * max(overlap, 0.0) / span
    return total


def throughput_per_gpu(records: Sequence[RequestRecord], num_gpus: int, window: Window | None = None) -> float:
    """Total (input + output) tokens per second per GPU over `window` (default: the whole run)."""
    if num_gpus < 1:
        raise ValueError(f"throughput_per_gpu: num_gpus must be >= 1, got {num_gpus}")
    window = window or full_window(records)
    return tokens_in_window(records, window) / window.duration_s / num_gpus


def requests_in_window(records: Sequence[RequestRecord], window: Window) -> list[RequestRecord]:
    """Requests that both arrived and finished inside the window: the latency sample."""
    return [r for r in records if window.start_s <= r.arrival_s and r.finish_s <= window.end_s]


def percentiles(values: Sequence[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float]:
    """{"p50": ..., "mean": ...} with linear interpolation; NaN for an empty sample."""
    if len(values) == 0:
        return {**{f"p{q}": math.nan for q in qs}, "mean": math.nan}
    arr = np.asarray(values, dtype=float)
    return {**{f"p{q}": float(np.percentile(arr, q)) for q in qs}, "mean": float(arr.mean())}


def interactivity(tpots_s: Sequence[float], q: int = 90) -> float:
    """1 / p`q`(TPOT) in tokens/s/user: with q=90, 90% of requests decode at least this fast."""
    if len(tpots_s) == 0:
        return math.nan
    return 1.0 / float(np.percentile(np.asarray(tpots_s, dtype=float), q))


def cache_hit_rate(records: Sequence[RequestRecord]) -> float:
    """Achieved prefix-cache hit rate: Σ cached input tokens / Σ input tokens."""
    total = sum(r.input_tokens for r in records)
    return sum(r.cached_tokens for r in records) / total if total else math.nan


def theoretical_prefix_reuse(trace: Trace) -> float:
    """Fraction of the trace's prompt blocks an unbounded cache would serve (leading-block matching)."""
    return float(reuse_summary(trace, served_blocks(trace))["block_fraction"])


def tokens_per_dollar(throughput_per_gpu_tps: float, price_per_gpu_hour: float) -> float:
    """Tokens bought by one dollar of GPU time."""
    if price_per_gpu_hour <= 0:
        raise ValueError(f"tokens_per_dollar: price_per_gpu_hour must be > 0, got {price_per_gpu_hour}")
    return throughput_per_gpu_tps * 3600.0 / price_per_gpu_hour


@dataclass(frozen=True)
class ServingSummary:
    """The metrics of one run (one concurrency point of one cell)."""

    window_start_s: float
    window_end_s: float
    num_requests: int
    num_requests_in_window: int
    num_gpus: int
    throughput_per_gpu: float
    output_throughput_per_gpu: float
    interactivity_p90: float
    ttft_s: dict[str, float]
    tpot_s: dict[str, float]
    e2e_s: dict[str, float]
    cache_hit_rate: float

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], num_gpus: int, window: Window | None = None) -> ServingSummary:
    """All per-run metrics over `window` (default: `steady_window` with its default fractions)."""
    window = window or steady_window(records)
    sample = requests_in_window(records, window)
    tpots = [t for r in sample if (t := r.tpot_s) is not None]
    output_only = [
        RequestRecord(r.arrival_s, r.first_token_s, r.finish_s, 0, r.output_tokens) for r in records
    ]
    return ServingSummary(
        window_start_s=window.start_s,
        window_end_s=window.end_s,
        num_requests=len(records),
        num_requests_in_window=len(sample),
        num_gpus=num_gpus,
        throughput_per_gpu=throughput_per_gpu(records, num_gpus, window),
        output_throughput_per_gpu=throughput_per_gpu(output_only, num_gpus, window),
        interactivity_p90=interactivity(tpots),
        ttft_s=percentiles([r.ttft_s for r in sample]),
        tpot_s=percentiles(tpots),
        e2e_s=percentiles([r.e2e_s for r in sample]),
        cache_hit_rate=cache_hit_rate(sample),
    )


def cell_metrics(records: Sequence[RequestRecord], num_gpus: int) -> dict[str, float]:
    """A cell's metrics over all its requests: total throughput per GPU (input + output tokens per second),
    output throughput, TTFT p50 and p90, P90 interactivity (tokens/s/user), prefix-cache hit rate."""
    summary = summarize(records, num_gpus, full_window(records))
    return {"total_throughput": summary.throughput_per_gpu, "output_throughput": summary.output_throughput_per_gpu,
            "ttft_p50_s": summary.ttft_s["p50"], "ttft_p90_s": summary.ttft_s["p90"],
            "interactivity_p90": summary.interactivity_p90, "prefix_hit_rate": summary.cache_hit_rate,
            "num_requests": summary.num_requests}


@dataclass(frozen=True)
class SweepPoint:
    """One concurrency point of a sweep: interactivity (tok/s/user) and throughput per GPU (tok/s)."""

    interactivity: float
    throughput_per_gpu: float
    concurrency: float | None = None


@dataclass(frozen=True)
class SLOValue:
    """Throughput/GPU at the interactivity target, or NaN with the reason it is missing."""

    value: float
    target_interactivity: float
    reason: str = ""

    @property
    def is_missing(self) -> bool:
        return math.isnan(self.value)


def frontier(points: Sequence[SweepPoint]) -> list[SweepPoint]:
    """The Pareto frontier (higher interactivity and higher throughput are both better), sorted by
    increasing interactivity; along it throughput strictly falls."""
    finite = [p for p in points if math.isfinite(p.interactivity) and math.isfinite(p.throughput_per_gpu)]
    best: list[SweepPoint] = []
    for p in sorted(finite, key=lambda p: (-p.interactivity, -p.throughput_per_gpu)):
        if not best or p.throughput_per_gpu > best[-1].throughput_per_gpu:
            best.append(p)
    return best[::-1]


def throughput_at_slo(points: Sequence[SweepPoint], target_interactivity: float = 50.0) -> SLOValue:
    """Throughput/GPU at `target_interactivity`, linearly interpolated between the two frontier points
    that bracket it. Where the sweep went below the target but only with dominated points (throughput falls past
    the last frontier point: a cache cliff), the frontier is flat down to the target: its last point's
    throughput. No extrapolation: NaN with a reason when no point reaches the target or when every point exceeds
    it."""
    front = frontier(points)
    if not front:
        return SLOValue(math.nan, target_interactivity, "no finite sweep point")
    if front[-1].interactivity < target_interactivity:
        return SLOValue(
            math.nan, target_interactivity,
            f"no point reaches {target_interactivity:g} tok/s/user (best {front[-1].interactivity:.3g})",
        )
    if front[0].interactivity > target_interactivity:
        if any(p.interactivity < target_interactivity and math.isfinite(p.throughput_per_gpu) for p in points):
            return SLOValue(front[0].throughput_per_gpu, target_interactivity)
        return SLOValue(
            math.nan, target_interactivity,
            f"not bracketed: every point exceeds {target_interactivity:g} tok/s/user "
            f"(lowest {front[0].interactivity:.3g}); sweep to higher concurrency",
        )
    for lo, hi in itertools.pairwise(front):
        if lo.interactivity <= target_interactivity <= hi.interactivity:
            if hi.interactivity == lo.interactivity:
                return SLOValue(max(lo.throughput_per_gpu, hi.throughput_per_gpu), target_interactivity)
            w = (target_interactivity - lo.interactivity) / (hi.interactivity - lo.interactivity)
            return SLOValue(lo.throughput_per_gpu + w * (hi.throughput_per_gpu - lo.throughput_per_gpu),
                            target_interactivity)
    return SLOValue(front[0].throughput_per_gpu, target_interactivity)


def _require(records: Sequence[RequestRecord]) -> None:
    if not records:
        raise ValueError("no request records")
