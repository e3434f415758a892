"""The host's work, fitted on the steps vLLM-CPU ran in the all-off cells: per engine step, scheduled token, request and
decode, and once in the first step (`fit_host_steps`, a nonnegative least squares)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ablations.backends.vllm.in_vllm.steps import step_seqs

FITTED = ("fitted by python -m ablations.fidelity on vLLM-CPU's all-off steps: each step's seconds less the "
          "simulator's kernel time for what it scheduled, least squares on [1, tokens, requests scheduled]")


@dataclass(frozen=True)
class Host:
    """The host's work per engine step, per scheduled token, per scheduled request and per scheduled decode or
    verification, and once in the first step (µs)."""

    per_step_us: float
    per_token_us: float = 0.0
    per_request_us: float = 0.0
    per_decode_us: float = 0.0
    first_step_us: float = 0.0


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y on the columns of x with every coefficient >= 0: the best fit over the subsets of
    columns whose own least squares is nonnegative (exact; 2^columns subsets, so for a few columns)."""
    best, best_err = np.zeros(x.shape[1]), float(y @ y)
    for mask in range(1, 2 ** x.shape[1]):
        cols = [j for j in range(x.shape[1]) if mask >> j & 1]
        coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
        if (coef < 0).any():
            continue
        left = y - x[:, cols] @ coef
        if float(left @ left) < best_err:
            best, best_err = np.zeros(x.shape[1]), float(left @ left)
            best[cols] = coef
    return best


def _host_row(requests: list[list[int]]) -> list[float]:
    """A recorded step's terms of the host fit: 1, tokens scheduled, requests scheduled, decodes and verifications
    scheduled."""
    decodes = sum(kind != "prefill" for *_, kind in step_seqs(requests))
    return [1.0, sum(r[0] for r in requests), len(requests), decodes]


def fit_host_steps(runs: list[list[dict[str, Any]]], kernel_seconds: Callable[[list[list[int]]], float]
                   ) -> dict[str, Any]:
    """The host overheads from vLLM-CPU's own steps (`steps.read_steps` records of each run): least squares of each
    step's seconds less `kernel_seconds` of what it scheduled, on [1, tokens scheduled, requests scheduled, decodes
    and verifications scheduled], every coefficient >= 0; the cost per step also takes the median gap from one
    step's end to the next one's start (the engine's loop outside the step). A run's first step is left out of the
    fit: it carries the engine's one-time initialisation (seconds on vLLM-CPU), the mean of whose excess over the
    fit is the first-step cost. Returns the Host and what the fit saw: steps, the fraction of the residual's
    variance the fit explains, the mean residual left in steps with and without a prefill chunk."""
    rows, left_s, gaps, firsts = [], [], [], []
    for steps in runs:
        if not steps:
            continue
        head = steps[0]["requests"]
        firsts.append((_host_row(head),
                       steps[0]["end"] - steps[0]["start"] - kernel_seconds(head)))
        for step, after in zip(steps[1:], [*steps[2:], None], strict=True):
            requests = step["requests"]
            rows.append(_host_row(requests))
            left_s.append(step["end"] - step["start"] - kernel_seconds(requests))
            if after is not None and after["start"] >= step["end"]:
                gaps.append(after["start"] - step["end"])
    if len(rows) < 2:
        raise ValueError(f"fidelity: {len(rows)} recorded all-off step(s); the host fit needs 2 or more")
    x, y = np.array(rows), np.array(left_s)
    coef = _nonnegative_fit(x, y)
    left = y - x @ coef
    gap = statistics.median(gaps) if gaps else 0.0
    prefills = x[:, 3] < x[:, 2]                            # fewer decodes than requests: a prefill chunk
    by_kind = {name: left[prefills == flag] for name, flag in (("with_prefill", True),
                                                                        ("decode_only", False))}
    first = max(statistics.mean(s - float(np.dot(coef, r)) for r, s in firsts), 0.0)
    per_step, per_token, per_request, per_decode = coef * 1e6
    spread = float(((y - y.mean()) ** 2).sum())
    return {"host": Host(per_step + gap * 1e6, per_token, per_request, per_decode, first * 1e6), "steps": len(rows),
            "gap_us": gap * 1e6, "first_step_s": first,
            "explained": 1 - float(left @ left) / spread if spread else 1.0,
            "residual_ms": {k: float(v.mean()) * 1e3 if v.size else math.nan for k, v in by_kind.items()}}


def host_line(host: dict[str, float]) -> str:
    """The fitted host costs in words."""
    return (f"{host['per_step_us']:.0f} us per step, {host['per_token_us']:.0f} us per token, "
            f"{host['per_request_us']:.0f} us per request, {host.get('per_decode_us', 0.0):.0f} us per decode")
