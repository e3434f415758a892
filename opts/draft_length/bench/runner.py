"""`python -m opts bench draft_length`: each case measured, evaluated on held-out repeats, printed as tables."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opts.bench import make_out_dir
from opts.draft_length.bench.evaluate import evaluate, table
from opts.draft_length.bench.step_times import measure
from opts.draft_length.cases import GoodputCase
from opts.machine import cpu_isa, cpu_model


def check_out_dir(out_dir: str | Path | None) -> Path | None:
    """The folder for the raw samples (None: none written), created; a file there is a ValueError."""
    return None if out_dir is None else make_out_dir(out_dir)


def run_case(case: GoodputCase, progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Measure one case's grid and evaluate it: its JSON row (the raw samples under "measurements")."""
    start = time.perf_counter()
    measurements = measure(case.batch_sizes, case.ks, case.repeats, shape=case.shape, threads=case.threads,
                           clock=case.clock, progress=progress)
    evaluation = evaluate(measurements, fixed_k=case.fixed_k, profiles=case.profiles)
    if progress:
        progress(table(evaluation))
    return {"case": case.name, "seconds": time.perf_counter() - start, **evaluation.to_dict(),
            "all_within_noise": all(r.is_within_noise for r in evaluation.rows),
            "measurements": measurements.to_dict()}


def run_bench(cases: list[GoodputCase], *, quick: bool, out_dir: str | Path | None = None,
              progress: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run each case, print its tables; with `out_dir`, also write `<out_dir>/<case>.json`. The JSON result."""
    out = check_out_dir(out_dir)
    start = time.perf_counter()
    rows = []
    for i, case in enumerate(cases, 1):
        if progress:
            progress(f"[case {i}/{len(cases)}] {case.name}: batch {list(case.batch_sizes)} x K {list(case.ks)} x "
                     f"{case.repeats} repeats, {case.threads} thread(s), {case.clock} clock")
        rows.append(run_case(case, progress))
        if out is not None:
            (out / f"{case.name}.json").write_text(json.dumps(rows[-1], indent=1))
    return {"optimization": "draft_length", "quick": quick, "cpu_model": cpu_model(), "cpu_isa": cpu_isa(),
            "seconds": time.perf_counter() - start, "out_dir": None if out is None else str(out), "cases": rows}
