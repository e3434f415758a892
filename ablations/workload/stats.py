"""Statistics of a trace: sizes, lengths, sessions, think times and theoretical prefix reuse.

Percentiles use numpy's default (linear interpolation between order statistics). `sessions` counts
root sessions (sub-agents apart); turns per session are the root sessions' own turns. Session figures
are None for a trace without sessions. `theoretical_prefix_reuse` is the fraction of all prompt blocks an
unbounded cache would serve (leading-block prefix matching, requests in arrival order);
`theoretical_prefix_reuse_tokens` weighs each served block by its tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ablations.workload.reuse import reuse_summary, served_blocks
from ablations.workload.trace import Trace

REUSE_BINS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


def _percentiles(prefix: str, values: np.ndarray, qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    out = {f"{prefix}_mean": float(values.mean()), f"{prefix}_max": float(values.max())}
    out.update({f"{prefix}_p{q}": float(np.percentile(values, q)) for q in qs})
    return out


def per_request_reuse(trace: Trace) -> np.ndarray:
    """Per request (trace order): the fraction of its prompt blocks an unbounded cache would serve."""
    return reuse_summary(trace, served_blocks(trace))["per_request"]


def trace_stats(trace: Trace) -> dict[str, Any]:
    """The trace's statistics as a flat dict of plain numbers (JSON-ready)."""
    inputs = np.array([r.input_length for r in trace.requests], dtype=np.float64)
    outputs = np.array([r.output_length for r in trace.requests], dtype=np.float64)
    stamps = np.array([r.timestamp_ms for r in trace.requests], dtype=np.float64)
    reuse = reuse_summary(trace, served_blocks(trace))
    per_request = reuse["per_request"]
    stats: dict[str, Any] = {
        "source": trace.source,
        "block_size": trace.block_size,
        "requests": len(trace.requests),
        "input_tokens": int(inputs.sum()),
        "output_tokens": int(outputs.sum()),
        "arrival_span_s": float((stamps.max() - stamps.min()) / 1000),
    }
    stats.update(_percentiles("input_len", inputs))
    stats.update(_percentiles("output_len", outputs))
    stats["theoretical_prefix_reuse"] = reuse["block_fraction"]
    stats["theoretical_prefix_reuse_tokens"] = reuse["token_fraction"]
    stats.update({f"request_reuse_p{q}": float(np.percentile(per_request, q)) for q in (10, 25, 50, 75, 90)})
    stats["request_reuse_mean"] = float(per_request.mean())
    counts, _ = np.histogram(per_request, bins=REUSE_BINS)
    stats["request_reuse_histogram"] = {f"{lo:g}-{hi:g}": int(n)
                                        for lo, hi, n in zip(REUSE_BINS, REUSE_BINS[1:], counts, strict=False)}
    stats.update(_session_stats(trace))
    return stats


def _session_stats(trace: Trace) -> dict[str, Any]:
    keys = ("sessions", "subagent_sessions", "requests_per_session_mean", "turns_per_session_mean",
            "turns_per_session_p50", "turns_per_session_p90", "turns_per_session_max", "subagent_turns_mean",
            "think_s_mean", "think_s_p50", "think_s_p90")
    out: dict[str, Any] = dict.fromkeys(keys)
    if not trace.has_sessions:
        return out
    roots = [s for s in trace.sessions.values() if s.parent is None]
    subagents = [s for s in trace.sessions.values() if s.parent is not None]
    turns = np.array([s.num_turns for s in roots], dtype=np.float64)
    out.update({
        "sessions": len(roots),
        "subagent_sessions": len(subagents),
        "requests_per_session_mean": len(trace.requests) / len(roots),
        "turns_per_session_mean": float(turns.mean()),
        "turns_per_session_p50": float(np.percentile(turns, 50)),
        "turns_per_session_p90": float(np.percentile(turns, 90)),
        "turns_per_session_max": int(turns.max()),
    })
    if subagents:
        out["subagent_turns_mean"] = float(np.mean([s.num_turns for s in subagents]))
    thinks = np.array([r.think_ms / 1000 for r in trace.requests if r.turn > 0 or r.parent_session is not None])
    if thinks.size:
        out.update({"think_s_mean": float(thinks.mean()), "think_s_p50": float(np.percentile(thinks, 50)),
                    "think_s_p90": float(np.percentile(thinks, 90))})
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _session_lines(s: dict[str, Any]) -> list[str]:
    return [
        f"sessions         {_fmt(s['sessions'])} (+ {_fmt(s['subagent_sessions'])} sub-agent sessions of "
        f"{_fmt(s['subagent_turns_mean'])} turns on average), {_fmt(s['requests_per_session_mean'])} requests each",
        f"turns/session    mean {_fmt(s['turns_per_session_mean'])} p50 {_fmt(s['turns_per_session_p50'])} "
        f"p90 {_fmt(s['turns_per_session_p90'])} max {_fmt(s['turns_per_session_max'])} (root sessions)",
        f"think time (s)   mean {_fmt(s['think_s_mean'])} p50 {_fmt(s['think_s_p50'])} p90 {_fmt(s['think_s_p90'])}",
    ]


def format_stats(stats: dict[str, Any]) -> str:
    """A short human-readable report of `trace_stats` output."""
    s = stats
    lines = [
        f"trace            {s['source'] or '(generated)'}",
        f"requests         {_fmt(s['requests'])}   block size {s['block_size']}   "
        f"arrivals span {s['arrival_span_s'] / 60:.1f} min",
        *(_session_lines(s) if s["sessions"] is not None else ["sessions         none recorded (open-loop only)"]),
        f"input tokens     mean {_fmt(s['input_len_mean'])} p50 {_fmt(s['input_len_p50'])} "
        f"p90 {_fmt(s['input_len_p90'])} p99 {_fmt(s['input_len_p99'])} max {_fmt(s['input_len_max'])}",
        f"output tokens    mean {_fmt(s['output_len_mean'])} p50 {_fmt(s['output_len_p50'])} "
        f"p90 {_fmt(s['output_len_p90'])} p99 {_fmt(s['output_len_p99'])} max {_fmt(s['output_len_max'])}",
        f"prefix reuse     {s['theoretical_prefix_reuse']:.4f} of blocks, "
        f"{s['theoretical_prefix_reuse_tokens']:.4f} of tokens (unbounded cache, leading-block matching)",
        f"per request      p10 {s['request_reuse_p10']:.4f} p50 {s['request_reuse_p50']:.4f} "
        f"p90 {s['request_reuse_p90']:.4f} mean {s['request_reuse_mean']:.4f}",
        "reuse histogram  " + "  ".join(f"{k}: {v}" for k, v in s["request_reuse_histogram"].items()),
    ]
    return "\n".join(lines)
