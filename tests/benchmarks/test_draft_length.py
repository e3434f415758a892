"""draft_length under pytest-benchmark: its cases report goodput, not off/on times, so what is timed is the quick
measurement and evaluation itself.

The quick set times real steps of the CPU stack, fits the cost model on the even repeats and scores fixed K = 3
against the chosen K per bucket on the odd ones, for the flat and the decaying profile. Reported, never asserted
(they are timings): the batch sizes where the chosen K's held-out goodput is below fixed K's by more than the noise
of the two cells (`extra_info["losses_beyond_noise"]`, printed). Goodputs, schedules and the fit go to
`extra_info`.
"""

from __future__ import annotations

import time

import pytest

from opts.draft_length.bench.runner import run_bench
from opts.draft_length.cases import bench_cases


@pytest.mark.slow
def test_quick_set(benchmark) -> None:
    cases = bench_cases(True, "cpu")
    start = time.perf_counter()
    benchmark.group = "draft_length"
    result = benchmark.pedantic(lambda: run_bench(cases, quick=True, progress=None), rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    row = result["cases"][0]
    benchmark.extra_info.update({
        "case": row["case"], "seconds": seconds, "cpu_model": result["cpu_model"], "noise": row["noise"],
        "cost_fit": row["cost_fit"], "fit_error": row["fit_error"], "schedules": row["schedules"],
        "rows": row["rows"]})
    assert [r["case"] for r in result["cases"]] == [case.name for case in cases]
    losers = [f"{r['profile']} b={r['batch']}: chosen K={r['chosen_k']} {r['chosen_goodput']:.1f} tok/s vs fixed "
              f"K={r['fixed_k']} {r['fixed_goodput']:.1f} (loss {r['loss_vs_fixed']:.1%} > noise {r['noise']:.1%})"
              for r in row["rows"] if not r["is_within_noise"]]
    benchmark.extra_info["losses_beyond_noise"] = losers
    print(f"draft_length quick set: {seconds:.0f} s; chosen K below fixed K beyond the noise: {losers or 'nowhere'}")
