"""moe_dedup under pytest-benchmark: its cases run on two real ranks (not in-process `BenchCase`s), so what is
timed is `run_bench` over the quick set (the tail at 1, 64 and 1024 tokens, K3 shapes, gloo, 1 thread per rank;
under a minute). Under the default `--benchmark-disable` only its 64-token case runs. Per case, the median
step times, on/off and sp/off, the per-rank FLOPs and the on/sp-vs-off differences go to `extra_info`.

Asserted: on and sp computed off's function (the check inside each case). Reported, never asserted (a timing):
on/off at the largest token count, where on does half the up-projection's FLOPs and reads half its weight at two
ranks with the same two collectives."""

from __future__ import annotations

import pytest

from opts.moe_dedup.bench.runner import run_bench
from opts.moe_dedup.cases import bench_cases


@pytest.mark.slow
@pytest.mark.spawns
def test_quick_set(benchmark) -> None:
    cases = bench_cases(True, "cpu")
    if not benchmark.enabled:
        cases = [c for c in cases if c.num_tokens == 64]
    benchmark.group = "moe_dedup"
    result = benchmark.pedantic(lambda: run_bench(cases, quick=True, progress=None), rounds=1, iterations=1)
    rows = result["cases"]
    benchmark.extra_info.update({"case": "quick_set", "seconds": result["seconds"], "cpu_model": result["cpu_model"],
                                 "crossover": result["crossover"], "cases": {
        r["case"]: {"num_tokens": r["num_tokens"], "on_over_off": r["on_over_off"], "sp_over_off": r["sp_over_off"],
                    **{f"{m}_median_s": v["median_s"] for m, v in r["modes"].items()},
                    **{f"{m}_gflop_per_rank": v["counts"]["flops"] / 1e9 for m, v in r["modes"].items()},
                    "max_abs_diff": r["max_abs_diff"], "out_scale": r["out_scale"]} for r in rows}})
    assert [r["case"] for r in rows] == [c.name for c in cases]
    for r in rows:
        for mode in ("on", "sp"):
            assert r["max_abs_diff"][mode] <= r["check_rtol"] * r["out_scale"], (r["case"], mode)
    largest = max(rows, key=lambda r: r["num_tokens"])
    print(f"moe_dedup {largest['case']}: on/off {largest['on_over_off']:.3f}")
