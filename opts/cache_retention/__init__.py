"""cache_retention: K3's hybrid prefix cache, vLLM's LRU eviction (off) against session-aware retention (on).

The model of vLLM's block pool is `pool.py` over a `stream.CacheStream` at a `geometry.CacheGeometry`; off is
`naive.run_off`, every mode is `retention.run` (evict: `evict.SessionFreeList`, resume: a turn's end kept); the
references are `reference.py` (unbounded cache, Belady). Its bench cases report hit rates, not times:
`bench/sweep.py` (capacities x policies), `cases.py`, `bench/runner.py` (`python -m opts bench cache_retention`),
`bench/plot.py`.
"""

from __future__ import annotations

from opts.base import Optimization
from opts.cache_retention import sim, vllm
from opts.cache_retention.bench.plot import plot_sweep
from opts.cache_retention.bench.runner import run_bench
from opts.cache_retention.bench.sweep import Scenario, SweepResult, scenario, scenarios, sweep
from opts.cache_retention.cases import HitRateCase, bench_cases
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.evict import SessionFreeList
from opts.cache_retention.naive import run_off
from opts.cache_retention.reference import run_belady, run_unbounded
from opts.cache_retention.retention import run
from opts.k3.cache import CacheStats, CapacityError, HybridPool, Resume, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import K3_TP8, TINY, CacheGeometry, k3_geometry
from opts.k3.cache.stream import CacheRequest, CacheStream

__all__ = [
    "K3_TP8",
    "OPTIMIZATION",
    "TINY",
    "CacheGeometry",
    "CacheRequest",
    "CacheRetentionConfig",
    "CacheStats",
    "CacheStream",
    "CapacityError",
    "HitRateCase",
    "HybridPool",
    "LruFreeList",
    "Resume",
    "Scenario",
    "SessionFreeList",
    "SweepResult",
    "bench_cases",
    "k3_geometry",
    "plot_sweep",
    "replay",
    "run",
    "run_belady",
    "run_bench",
    "run_off",
    "run_unbounded",
    "scenario",
    "scenarios",
    "sweep",
]


OPTIMIZATION = Optimization(
    name="cache_retention",
    description="hybrid prefix cache: vLLM's LRU eviction against session-aware retention (hit rates)",
    config_cls=CacheRetentionConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
    run_bench=run_bench,
    writes_files=True,
)
