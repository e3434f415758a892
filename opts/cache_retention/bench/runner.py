"""`python -m opts bench cache_retention`: each hit-rate case swept, printed as a table and plotted."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opts.bench import make_out_dir
from opts.cache_retention.bench.plot import plot_sweep
from opts.cache_retention.bench.sweep import SweepResult, available_cores, sweep
from opts.cache_retention.cases import HitRateCase
from opts.machine import cpu_model

DEFAULT_OUT = Path("outputs") / "cache_retention"


def check_out_dir(out_dir: str | Path | None) -> Path:
    """The plots' folder (default `outputs/cache_retention/` here), created; a file there is a ValueError."""
    return make_out_dir(out_dir if out_dir is not None else DEFAULT_OUT)


def case_row(case: HitRateCase, result: SweepResult, plot: Path) -> dict[str, Any]:
    """One case's JSON row: the sweep, its plot, and `ratio`, the smallest on/off over the feasible capacities."""
    ratios = [r for r in result.ratios() if r is not None]
    return {"case": case.name, "ratio": min(ratios) if ratios else None, **result.to_dict(), "plot": str(plot)}


def run_bench(cases: list[HitRateCase], *, quick: bool, out_dir: str | Path | None = None,
              workers: int | None = None, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Sweep each case, print its table, write its plot `<out_dir>/<case>.png`; the JSON result."""
    out = check_out_dir(out_dir)
    start = time.perf_counter()
    rows = []
    for i, case in enumerate(cases, 1):
        if progress:
            progress(f"[case {i}/{len(cases)}] {case.name}: {len(case.fractions)} capacities x "
                     f"{', '.join(case.policies)}")
        result = sweep(case.scenario, case.fractions, case.policies, workers=workers, progress=progress)
        plot = plot_sweep(result, out / f"{case.name}.png")
        rows.append(case_row(case, result, plot))
        if progress:
            progress(result.table())
            progress(f"on/off (smallest over capacities): {_ratio(rows[-1]['ratio'])}; plot: {plot}")
    return {"optimization": "cache_retention", "quick": quick, "cpu_model": cpu_model(),
            "cores": available_cores(), "seconds": time.perf_counter() - start, "out_dir": str(out), "cases": rows}


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"
