"""cache_retention under pytest-benchmark: its cases report hit rates, so what is timed is the model itself.

One policy (on) at one capacity (5% of the working set) of the agentx preset at K3_TP8 (goal: under 20 CPU-s,
reported in `extra_info` and the README, never asserted: no test asserts a time), and the whole `--quick` set
(goal: under 10 s, reported). Hit rates and on/off ratios go to `extra_info`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ablations.workload.cache_stream import preset_stream
from opts.cache_retention.bench.runner import run_bench
from opts.cache_retention.bench.sweep import num_blocks_at, run_policy
from opts.cache_retention.cases import bench_cases
from opts.cache_retention.reference import run_unbounded
from opts.k3.cache.geometry import K3_TP8

FRACTION = 0.05


@pytest.mark.slow
def test_agentx_one_policy_at_one_capacity(benchmark) -> None:
    stream = preset_stream("agentx")
    working = run_unbounded(stream, K3_TP8).info["working_set_blocks"]
    num_blocks = num_blocks_at(working, FRACTION)
    cpu: list[float] = []

    def on():
        start = time.process_time()
        stats = run_policy(stream, K3_TP8, "on", num_blocks)
        cpu.append(time.process_time() - start)
        return stats

    benchmark.group = "cache_retention"
    on_stats = benchmark.pedantic(on, rounds=1, iterations=1)
    off_stats = run_policy(stream, K3_TP8, "off", num_blocks)
    benchmark.extra_info.update({
        "case": "agentx_on_5pct", "geometry": K3_TP8.name, "num_requests": len(stream.requests),
        "working_set_blocks": working, "fraction": FRACTION, "num_blocks": num_blocks, "on_cpu_s": cpu[0],
        "on_hit_rate": on_stats.hit_rate, "off_hit_rate": off_stats.hit_rate,
        "ratio": on_stats.hit_rate / off_stats.hit_rate,
    })
    assert on_stats.hit_rate > off_stats.hit_rate


@pytest.mark.slow
@pytest.mark.spawns
def test_quick_set(benchmark, tmp_path: Path) -> None:
    cases = bench_cases(True, "cpu")
    start = time.perf_counter()
    benchmark.group = "cache_retention"
    result = benchmark.pedantic(lambda: run_bench(cases, quick=True, out_dir=tmp_path, progress=None),
                                rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    benchmark.extra_info.update({"case": "quick_set", "seconds": seconds, "cores": result["cores"], "cases": {
        row["case"]: {"ratio": row["ratio"], "ratios": row["ratios"], "fractions": row["fractions"],
                      "hit_rates": row["hit_rates"], "unbounded_hit_rate": row["unbounded_hit_rate"]}
        for row in result["cases"]}})
    assert [row["case"] for row in result["cases"]] == [case.name for case in cases]
    assert all((tmp_path / f"{case.name}.png").is_file() for case in cases)
