"""pytest-benchmark plumbing shared by every optimization: each bench case is one test, off and on together.

A benchmark module names its optimization and takes the `bench_case` parameter:

    OPTIMIZATION = "aiter_mla"

    def test_aiter_mla(bench_case, run_bench):
        run_bench(bench_case)

Each case is one test. It sets the case up, runs off and on once on the same inputs and checks on against
off within the case's tolerance (`opts.bench.checked_pair`), then, when benchmarks are measured, times
both interleaved (off-on, on-off, ...) as `python -m opts bench NAME` does. pytest-benchmark's statistics
are those of one round (off + on); `extra_info` of `--benchmark-json` holds each side's median, the
median per-round off/on `ratio`, the largest off/on difference, the case's bytes, flops and GB/s.

Which cases: when benchmarks are measured (`--benchmark-only` or `--benchmark-enable`) the full set of
every optimization; K3_BENCH_QUICK=1 selects the quick sets. K3_BENCH_SECONDS (default 2) is the timing
budget per case: rounds = budget over one round's time, between 3 and 30. K3_BENCH_THREADS=N runs torch on
N CPU threads (default: torch's own; 1 is steadier on a CPU shared with other jobs). Under the default
`--benchmark-disable` (pyproject addopts) each test runs its quick set once: the off/on check, untimed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from opts import registry
from opts.base import BenchCase
from opts.bench import Rounds, checked_pair, default_device, machine_info

MIN_ROUNDS, MAX_ROUNDS = 3, 30


def is_full_set(config: pytest.Config) -> bool:
    if os.environ.get("K3_BENCH_QUICK", "") == "1":
        return False
    return bool(config.getoption("benchmark_enable", default=False))


def seconds_per_case() -> float:
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
    metafunc.parametrize("bench_case", [pytest.param(case, id=case.name) for case in cases])


@pytest.fixture(scope="module")
def _threads() -> Iterator[None]:
    threads, before = bench_threads(), torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def run_bench(benchmark: Any, _threads: None) -> Callable[[BenchCase], None]:
    """run_bench(case): check on against off, then (when measuring) time both interleaved in this one test."""
    device = default_device()

    def run(case: BenchCase) -> None:
        pair, max_abs_diff = checked_pair(case, device)
        benchmark.group = case.name
        benchmark.extra_info.update({"case": case.name, "bytes": case.bytes, "flops": case.flops,
                                     "max_abs_diff": max_abs_diff, "atol": case.atol, "rtol": case.rtol,
                                     **machine_info(device), **case.info})
        if not benchmark.enabled:
            benchmark.pedantic(Rounds(pair, device), rounds=1, iterations=1)
            return
        probe = Rounds(pair, device)
        probe()
        first = probe.off_s[0] + probe.on_s[0]
        count = min(MAX_ROUNDS, max(MIN_ROUNDS, math.ceil(seconds_per_case() / first)))
        rounds = Rounds(pair, device)
        benchmark.pedantic(rounds, rounds=count, iterations=1)
        timing = rounds.timing()
        off_s, on_s = timing.off_median_s, timing.on_median_s
        benchmark.extra_info.update({
            "off_median_s": off_s, "on_median_s": on_s, "ratio": timing.ratio,
            "off_GBps": case.bytes / off_s / 1e9, "on_GBps": case.bytes / on_s / 1e9,
            "on_GFLOPs": case.flops / on_s / 1e9,
        })

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Benchmarks, even as untimed smoke runs, belong to the full tier (`make test`), not `make check`."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.slow)
