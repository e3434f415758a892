"""pytest-benchmark plumbing shared by every optimization: its bench cases, off and on, as benchmark tests.

A benchmark module names its optimization and takes the `bench_case` / `bench_side` parameters:

    OPTIMIZATION = "aiter_mla"

    def test_aiter_mla(bench_case, bench_side, run_bench):
        run_bench(bench_case, bench_side)

Each case becomes two tests, `<case>-off` and `<case>-on`, run back to back on the same inputs (built
once by the case's `setup`, freed when the next case starts or the module ends), grouped per case in the
report, with the case's bytes, flops and achieved GB/s in `extra_info` of `--benchmark-json`.

Which cases: when benchmarks are measured (`--benchmark-only` or `--benchmark-enable`) the full set of
every optimization, as `python -m opts bench NAME` runs it; K3_BENCH_QUICK=1 selects the quick sets.
K3_BENCH_SECONDS (default 2) is the timing budget per case and side: the round count is that budget over
one call's time, between 3 and 30. K3_BENCH_THREADS=N runs torch on N CPU threads
(default: torch's own; 1 is steadier on a CPU shared with other jobs). Under the default `--benchmark-disable`
(pyproject addopts) each test runs its quick set's functions once, a smoke test.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from opts import registry
from opts.base import BenchCase, BenchPair
from opts.bench import default_device, synchronize

SIDES = ("off", "on")
MIN_ROUNDS, MAX_ROUNDS = 3, 30


def is_full_set(config: pytest.Config) -> bool:
    if os.environ.get("K3_BENCH_QUICK", "") == "1":
        return False
    return bool(config.getoption("benchmark_enable", default=False))


def seconds_per_side() -> float:
    value = os.environ.get("K3_BENCH_SECONDS", "2")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"K3_BENCH_SECONDS: invalid value {value!r}; must be a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"K3_BENCH_SECONDS: invalid value {value!r}; must be > 0")
    return seconds


def bench_threads() -> int | None:
    value = os.environ.get("K3_BENCH_THREADS", "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"K3_BENCH_THREADS: invalid value {value!r}; must be an int >= 1")
    return int(value)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bench_case" not in metafunc.fixturenames:
        return
    name = getattr(metafunc.module, "OPTIMIZATION", None)
    if name is None:
        raise ValueError(f"{metafunc.module.__file__}: a benchmark module must set OPTIMIZATION = '<name>'; "
                         f"valid names: {', '.join(registry.names())}")
    cases = registry.get(name).bench_cases(not is_full_set(metafunc.config), default_device())
    params = [pytest.param(case, side, id=f"{case.name}-{side}") for case in cases for side in SIDES]
    metafunc.parametrize(("bench_case", "bench_side"), params)


class _PairCache:
    """Keeps the inputs of the case being measured, so off and on share them; one case at a time."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.pair: BenchPair | None = None

    def get(self, case: BenchCase) -> BenchPair:
        if self.name != case.name or self.pair is None:
            self.name, self.pair = None, None
            self.pair, self.name = case.setup(), case.name
        return self.pair


@pytest.fixture(scope="module")
def _pairs() -> Iterator[_PairCache]:
    threads, before = bench_threads(), torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    yield _PairCache()
    torch.set_num_threads(before)


@pytest.fixture
def run_bench(benchmark: Any, _pairs: _PairCache) -> Callable[[BenchCase, str], None]:
    """run_bench(case, side): benchmark `side` ("off" or "on") of `case`, with its bytes and flops attached."""
    device = default_device()

    def run(case: BenchCase, side: str) -> None:
        if side not in SIDES:
            raise ValueError(f"side: invalid value {side!r}; valid choices: {', '.join(SIDES)}")
        fn = getattr(_pairs.get(case), side)

        def call() -> None:
            fn()
            synchronize(device)

        benchmark.group = case.name
        benchmark.extra_info.update({"case": case.name, "side": side, "bytes": case.bytes, "flops": case.flops,
                                     "device": device, "threads": torch.get_num_threads(), **case.info})
        if not benchmark.enabled:
            benchmark.pedantic(call, rounds=1)
            return
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        rounds = min(MAX_ROUNDS, max(MIN_ROUNDS, math.ceil(seconds_per_side() / first)))
        benchmark.pedantic(call, rounds=rounds, iterations=1)
        median = benchmark.stats.stats.median
        benchmark.extra_info.update({"median_s": median, "GBps": case.bytes / median / 1e9,
                                     "GFLOPs": case.flops / median / 1e9})

    return run
