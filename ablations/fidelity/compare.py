"""Measured against predicted: each cell's relative errors, each toggle's effect against all off beside the noise, and
whether the simulator moves each metric the same way (`compare`, `compare_points`; `paired_effects` for --paired)."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import replace
from typing import Any

from ablations.experiment import ALL_OFF
from ablations.fidelity.cells import Schedule, SimCells
from ablations.fidelity.host import Host

METRICS = ("total_throughput", "ttft_p50_s", "interactivity_p90", "prefix_hit_rate")

SIM_NONE = 1e-3    # a simulated effect under 0.1% of all off's value moves nothing: it agrees with no measured move


def _sign(x: float, noise: float) -> int:
    return 0 if abs(x) <= noise else (1 if x > 0 else -1)


def _relative(x: float, base: float) -> float:
    if base:
        return x / base - 1
    return 0.0 if x == base else math.nan


def by_cell(sequence: list[tuple[str, dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    """Runs in order as each cell's runs (cells in the order of their first run)."""
    out: dict[str, list[dict[str, float]]] = {}
    for cell, metrics in sequence:
        out.setdefault(cell, []).append(metrics)
    return out


def paired_effects(sequence: list[tuple[str, dict[str, float]]]
                   ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """From vLLM cells in run order, all off alternating with the toggle cells: per toggle cell and metric, the mean
    over its runs of each run's relative change against the mean of the all-off runs either side of it; and per
    metric the noise, the largest relative change from one all-off run to the next (two cells apart, as a toggle
    run's two neighbours are)."""
    effects: dict[str, list[dict[str, float]]] = {}
    for i, (cell, metrics) in enumerate(sequence):
        if cell == ALL_OFF:
            continue
        sides = [sequence[j] for j in (i - 1, i + 1) if 0 <= j < len(sequence)]
        if len(sides) != 2 or any(side != ALL_OFF for side, _ in sides):
            raise ValueError(f"fidelity: {cell} (run {i + 1} of {len(sequence)}) lacks an all-off run on both sides; "
                             "a paired run alternates all off with the toggle cells")
        effects.setdefault(cell, []).append(
            {m: _relative(metrics[m], statistics.mean(s[m] for _, s in sides)) for m in METRICS})
    offs = [metrics for cell, metrics in sequence if cell == ALL_OFF]
    noise = {}
    for m in METRICS:
        steps = [abs(_relative(b[m], a[m])) for a, b in itertools.pairwise(offs)]
        noise[m] = max((x for x in steps if not math.isnan(x)), default=math.nan)
    return {cell: {m: statistics.mean(r[m] for r in runs) for m in METRICS} for cell, runs in effects.items()}, noise


def compare(measured: dict[str, list[dict[str, float]]], predicted: dict[str, dict[str, float]],
            players: tuple[str, ...], sequence: list[tuple[str, dict[str, float]]] | None = None
            ) -> dict[str, Any]:
    """Per cell, the error of each metric; per toggle and metric, the measured and predicted effect against all off,
    the noise (all off's range over its repeats) and whether the directions agree (None: within the noise; a
    simulated effect under SIM_NONE of all off's value is no move, so it agrees with none).
    `sequence` (the runs in order, paired): effects and noise relative, as `paired_effects` gives them."""
    if sequence is None:
        paired = None
        base = {m: statistics.mean(r[m] for r in measured[ALL_OFF]) for m in METRICS}
        noise = {m: max(r[m] for r in measured[ALL_OFF]) - min(r[m] for r in measured[ALL_OFF]) for m in METRICS}
    else:
        paired, noise = paired_effects(sequence)
    cells = []
    for cell, runs in measured.items():
        vllm = {m: statistics.mean(r[m] for r in runs) for m in METRICS}
        sim = predicted[cell]
        cells.append({"cell": cell, "runs": len(runs), "vllm": vllm, "sim": {m: sim[m] for m in METRICS},
                      "vllm_range": {m: [min(r[m] for r in runs), max(r[m] for r in runs)] for m in METRICS},
                      "error": {m: sim[m] / vllm[m] - 1 if vllm[m] else math.nan for m in METRICS}})
    toggles = []
    on_cells = [c for c in measured if c != ALL_OFF]
    for cell in on_cells:
        for m in METRICS:
            if paired is None:
                effect = statistics.mean(r[m] for r in measured[cell]) - base[m]
                sim_effect = predicted[cell][m] - predicted[ALL_OFF][m]
            else:
                effect, sim_effect = paired[cell][m], _relative(predicted[cell][m], predicted[ALL_OFF][m])
            beyond = abs(effect) > noise[m]
            sim_none = SIM_NONE * (1.0 if paired is not None else abs(predicted[ALL_OFF][m]))
            toggles.append({"cell": cell, "metric": m, "vllm_effect": effect, "sim_effect": sim_effect,
                            "noise": noise[m], "beyond_noise": beyond,
                            "agree": (_sign(effect, 0) == _sign(sim_effect, sim_none)) if beyond else None})
    return {"players": list(players), "noise": noise, "cells": cells, "toggles": toggles,
            "relative": paired is not None}


def compare_points(measured: dict[int, dict[str, list[dict[str, float]]]],
                   predicted: dict[int, dict[str, dict[str, float]]], players: tuple[str, ...],
                   sequences: dict[int, list[tuple[str, dict[str, float]]]] | None = None) -> dict[str, Any]:
    """`compare` at each concurrency (keys: live sessions), against that concurrency's own all off and noise; every
    row and the noise carry their concurrency. `sequences`: each concurrency's runs in order (paired)."""
    out: dict[str, Any] = {"players": list(players), "noise": [], "cells": [], "toggles": [],
                           "relative": sequences is not None}
    for concurrency in measured:
        one = compare(measured[concurrency], predicted[concurrency], players,
                      None if sequences is None else sequences[concurrency])
        out["noise"].append({"concurrency": concurrency, **one["noise"]})
        out["cells"] += [{"concurrency": concurrency, **row} for row in one["cells"]]
        out["toggles"] += [{"concurrency": concurrency, **row} for row in one["toggles"]]
    return out


def cell_points(result: dict[str, Any], concurrencies: list[int]) -> dict[int, dict[str, float]]:
    """A vLLM cell's metrics per concurrency: a serving cell's points (in `concurrencies`' order), an in-process
    cell's one replay at the only concurrency."""
    cell = result["cell"]
    if cell.get("mode") != "serve":
        return {concurrencies[0]: result["metrics"]}
    points = {p["concurrency"]: p["metrics"] for p in cell["point_details"]}
    if list(points) != concurrencies:
        raise ValueError(f"fidelity: a serving cell ran concurrencies {list(points)}; expected {concurrencies}")
    return points


def predict(sim: SimCells, host: Host, cells: dict[int, list[str]], schedules: dict[str, Schedule]
            ) -> dict[int, dict[str, dict[str, float]]]:
    """The simulator's metrics of `cells[concurrency]` at each concurrency, in `sim.concurrencies`' order; the host's
    first-step cost goes to the first only (a server that is not warmed up, backend.warmup_requests=0, pays its
    one-time start-up there)."""
    return {c: {cell: sim.metrics(cell, host if i == 0 else replace(host, first_step_us=0.0), schedules.get(cell, ()),
                                  c)
                for cell in cells[c]}
            for i, c in enumerate(sim.concurrencies)}
