"""One simulated ablation cell: the toggle vector applied to the modelled node, the workload replayed at each
concurrency of the sweep, the points and the headline (throughput per GPU at the target interactivity), in the
same form as the vLLM backend's serving cell."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Mechanisms, Parallel, SimModel
from ablations.backends.sim.engine import EngineStats, SchedulerConfig, simulate, trace_keys
from ablations.backends.sim.models import MODELS
from ablations.backends.sim.served import graphs, served_model
from ablations.backends.sim.step_model import DecodeSeconds, DraftSteps, StepModel, one_k
from ablations.backends.sim.timing import cache_capacity_gb
from ablations.hardware import HardwareConfig
from ablations.metrics import (
    RequestRecord,
    SweepPoint,
    cell_metrics,
    frontier,
    steady_window,
    summarize,
    throughput_at_slo,
    tokens_per_dollar,
)
from ablations.workload.trace import Trace
from opts.base import ToggleConfig
from opts.k3.cache import Resume
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import CacheGeometry, geometry
from opts.registry import OPTIMIZATIONS
from opts.sim_setting import SimSetting

log = logging.getLogger("ablations")


@dataclass(frozen=True)
class SimSetup:
    """Everything one cell's replays share: the model, its parallelism, the step model of each draft length and the
    K of each batch size (the toggles' kernel classes and mechanisms in them), the cache pool's geometry, size,
    free order and resume point, the acceptance rates, the scheduler."""

    model: SimModel
    parallel: Parallel
    hardware: HardwareConfig
    steps: DraftSteps
    geometry: CacheGeometry
    cache_gb: float
    num_blocks: int
    alphas: tuple[float, ...]
    free_list: Callable[[], Any]
    resume: Resume | None
    scheduler: SchedulerConfig

    @property
    def num_gpus(self) -> int:
        return self.parallel.tp


def settings(toggles: dict[str, ToggleConfig], platform: str) -> dict[str, SimSetting]:
    """Each toggle's `sim.py` setting on `platform`; a mode the simulator does not model is a ValueError naming it."""
    return {name: OPTIMIZATIONS[name].sim_setting(config, platform) for name, config in toggles.items()}


def unmodelled(toggles: dict[str, ToggleConfig], platform: str) -> list[str]:
    """One line per toggle whose mode the simulator does not model on `platform`."""
    out = []
    for name, config in toggles.items():
        try:
            OPTIMIZATIONS[name].sim_setting(config, platform)
        except ValueError as err:
            out.append(str(err))
    return out


def mean_context(trace: Trace) -> float:
    """The mean context a decode step of `trace` sees: a request's prompt and half its answer, averaged."""
    return sum(r.input_length + r.output_length / 2 for r in trace.requests) / len(trace.requests)


def draft_steps(setting: SimSetting, build: Callable[[int, Mechanisms], StepModel],
                mech: Mechanisms, trace: Trace | None) -> DraftSteps:
    """draft_length's step models and the K of each batch size: its fixed K, or the schedule its chooser picks on
    this node's own c(b, K) at the workload's mean context (on). The fused KDA decode (the setting's
    `fused["kda_decode"]`) only when no K is above 0: vLLM then configures no speculation
    (`opts/draft_length/vllm.py`), and it decides at construction (amd/ops/kda_decode.py)."""
    probes: dict[int, StepModel] = {}
    if setting.draft_schedule is None:
        schedule = one_k(setting.num_drafts or 0)
    elif trace is None:
        raise ValueError("draft_length on: its chooser weighs step times at the workload's mean context; "
                         "sim_setup needs the trace")
    else:
        probes = {k: build(k, mech) for k in range(setting.num_drafts + 1)}
        schedule = setting.draft_schedule(DecodeSeconds(probes, mean_context(trace)))
    ks = {k for _, _, k in schedule}
    if "kda_decode" in setting.fused and ks == {0}:
        return DraftSteps({0: build(0, replace(mech, fused_kda_decode=setting.fused["kda_decode"]))}, schedule)
    return DraftSteps({k: probes.get(k) or build(k, mech) for k in ks}, schedule)


def sim_setup(backend: SimBackendConfig, model_name: str, hardware: HardwareConfig,
              toggles: dict[str, ToggleConfig], trace: Trace | None = None) -> SimSetup:
    """The cell's setup, or a ValueError naming what cannot be simulated (model, toggle mode, node, fit);
    `trace`: the workload, which draft_length on's chooser needs."""
    if model_name not in MODELS:
        raise ValueError(f"model: {model_name!r} is not modelled by backend=sim; valid: {', '.join(MODELS)}")
    problems = unmodelled(toggles, hardware.platform)
    if problems:
        raise ValueError(problems[0])
    applied = SimSetting.merged(settings(toggles, hardware.platform).values())
    model = served_model(backend, MODELS[model_name], hardware.platform)
    parallel = Parallel(tp=backend.tp or hardware.num_devices, moe=backend.moe)
    mech = Mechanisms(packed_kda=applied.packed_kda, kda_streams=applied.kda_streams,
                      sharded_latent_up=applied.sharded_latent_up, latent_up_tier=applied.latent_up_tier,
                      sequence_parallel_moe=applied.sequence_parallel_moe, fused_mla_norm=applied.fused.get("mla_norm"))
    left = cache_capacity_gb(model, parallel, hardware, backend.gpu_memory_utilization, backend.non_kv_gb, mech=mech)
    if backend.cache_gb > left:
        raise ValueError(f"backend.cache_gb: {backend.cache_gb:g} GB per rank is more than the {left:.1f} GB "
                         f"{hardware.name} has left after {model_name}'s weights; valid: 0 < cache_gb <= {left:.1f}")
    cache_gb = backend.cache_gb or left
    launch = graphs(backend, model, hardware, applied.num_drafts or 0)
    classes = applied.kernel_classes

    def build(k: int, mech: Mechanisms) -> StepModel:
        # a step without drafts has no verification rows for kda_overlap to move
        return StepModel(model, parallel, hardware, k, classes=classes, graphs=launch,
                         mech=mech if k else replace(mech, packed_kda=False, kda_streams=False))

    steps = draft_steps(applied, build, mech, trace)
    layout = geometry(model.spec, tp=parallel.tp, kv_bytes=int(model.kv_bytes), conv_bytes=int(model.conv_bytes),
                    num_spec_tokens=steps.max_k)
    return SimSetup(model, parallel, hardware, steps, layout, cache_gb, layout.num_blocks(cache_gb * 1e9),
                    applied.alphas[:steps.max_k], applied.free_list or LruFreeList, applied.resume,
                    SchedulerConfig(backend.max_num_batched_tokens, backend.max_num_seqs))


def replay(setup: SimSetup, trace: Trace, concurrency: int, seed: int,
           keys: list[list] | None = None) -> tuple[list[RequestRecord], EngineStats]:
    """The trace through the simulated engine of `setup` at `concurrency` live sessions: its per-request records
    and the engine's stats (`keys`: the trace's `trace_keys`, when shared)."""
    return simulate(trace, setup.steps, setup.geometry, setup.num_blocks, setup.free_list(), resume=setup.resume,
                    alphas=setup.alphas, scheduler=setup.scheduler, concurrency=concurrency, seed=seed, keys=keys)


def run_point(setup: SimSetup, trace: Trace, concurrency: int, seed: int,
              keys: list[list] | None = None) -> dict[str, Any]:
    """The trace replayed at `concurrency` live sessions: the point's steady-state interactivity and throughput
    per GPU, its metrics over all requests, the engine's stats (`keys`: the trace's `trace_keys`, when shared)."""
    start = time.perf_counter()
    records, stats = replay(setup, trace, concurrency, seed, keys)
    window = steady_window(records)
    steady = summarize(records, setup.num_gpus, window)
    return {"concurrency": concurrency, "interactivity": steady.interactivity_p90,
            "throughput_per_gpu": steady.throughput_per_gpu, "steady_window_s": [window.start_s, window.end_s],
            "metrics": cell_metrics(records, setup.num_gpus), "steady": steady.to_dict(),
            "engine": asdict(stats), "simulated_s": max(r.finish_s for r in records),
            "wall_s": time.perf_counter() - start}


_KEYS: dict[int, tuple[Trace, list[list]]] = {}


def shared_keys(trace: Trace, block_size: int) -> list[list]:
    """`trace_keys(trace, block_size)`, built once per process for the latest trace at each block size: the
    cells of a sweep on one worker share them (never changed by a replay)."""
    entry = _KEYS.get(block_size)
    if entry is None or entry[0] is not trace:
        entry = _KEYS[block_size] = (trace, trace_keys(trace, block_size))
    return entry[1]


_SHARED: dict[str, Any] = {}      # what forked workers read: the setup, trace and keys, never pickled


def _point_task(concurrency: int) -> dict[str, Any]:
    setup, trace, keys, seed = _SHARED["point"]
    return run_point(setup, trace, concurrency, seed, keys)


def _points(setup: SimSetup, trace: Trace, keys: list[list], concurrencies: list[int], seed: int,
            workers: int) -> Iterator[dict[str, Any]]:
    """The points in sweep order, computed on `workers` forked processes (each point is independent and seeded,
    so the results do not depend on the workers)."""
    if workers <= 1:
        for concurrency in concurrencies:
            yield run_point(setup, trace, concurrency, seed, keys)
        return
    _SHARED["point"] = (setup, trace, keys, seed)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            yield from pool.map(_point_task, concurrencies)
    finally:
        _SHARED.clear()


def _bracket(setup: SimSetup, trace: Trace, keys: list[list], backend: SimBackendConfig) -> Iterator[dict[str, Any]]:
    """The points that bracket the target interactivity, from `backend.bracket_from` up while above it or down
    while below, one at a time."""
    order = sorted(backend.concurrency)
    i = order.index(backend.bracket_from)
    point = run_point(setup, trace, order[i], backend.seed, keys)
    yield point
    up = point["interactivity"] >= backend.target_interactivity
    while 0 <= (i := i + (1 if up else -1)) < len(order):
        point = run_point(setup, trace, order[i], backend.seed, keys)
        yield point
        if (point["interactivity"] >= backend.target_interactivity) != up:
            return


def run_sim_cell(backend: SimBackendConfig, model_name: str, hardware: HardwareConfig,
                 toggles: dict[str, ToggleConfig], trace: Trace) -> dict[str, Any]:
    """The cell: every concurrency of `backend.concurrency` (only the target's bracket with
    `backend.bracket_from`), the frontier, the throughput per GPU at `backend.target_interactivity` (absent from
    the metrics, with the reason in `slo`, when not bracketed) and tokens per dollar there; the other metrics at
    the highest concurrency (at `bracket_from` with a bracket search)."""
    setup = sim_setup(backend, model_name, hardware, toggles, trace)
    log.info("sim: %s on %s (tp %d, moe %s), %.1f GB of cache per rank (%d blocks of %d tokens), %d drafts; %d "
             "requests; concurrencies %s", model_name, hardware.name, setup.parallel.tp, setup.parallel.moe,
             setup.cache_gb, setup.num_blocks, setup.geometry.block_size, setup.steps.max_k, len(trace.requests),
             backend.concurrency)
    keys = shared_keys(trace, setup.geometry.block_size)
    if backend.bracket_from:
        found = _bracket(setup, trace, keys, backend)
    else:
        workers = min(backend.workers or os.cpu_count() or 1, len(backend.concurrency))
        found = _points(setup, trace, keys, backend.concurrency, backend.seed, workers)
    points = []
    for k, point in enumerate(found, 1):
        points.append(point)
        log.info("sim: [point %d/%s] concurrency %d: %.1f tokens/s/GPU at P90 %.2f tokens/s/user, TTFT p50 %.2f s, "
                 "hit rate %.3f (%.1f s simulated in %.1f s)", k,
                 f"<={len(backend.concurrency)}" if backend.bracket_from else len(backend.concurrency),
                 point["concurrency"],
                 point["throughput_per_gpu"], point["interactivity"], point["metrics"]["ttft_p50_s"],
                 point["metrics"]["prefix_hit_rate"], point["simulated_s"], point["wall_s"])
    points.sort(key=lambda p: p["concurrency"])
    sweep = [SweepPoint(p["interactivity"], p["throughput_per_gpu"], p["concurrency"]) for p in points]
    slo = throughput_at_slo(sweep, backend.target_interactivity)
    # the cell's metrics: at the highest concurrency, or where every bracket search starts (the same in every cell)
    at = backend.bracket_from or points[-1]["concurrency"]
    metrics = dict(next(p for p in points if p["concurrency"] == at)["metrics"])
    per_dollar = None
    if not slo.is_missing:
        metrics["tput_per_gpu_at_slo"] = slo.value
        if hardware.price_per_gpu_hour:
            per_dollar = tokens_per_dollar(slo.value, hardware.price_per_gpu_hour)
            metrics["tokens_per_dollar_at_slo"] = per_dollar
    return {
        "mode": "sim",
        "hardware": hardware.name,
        "parallel": asdict(setup.parallel),
        "cache_gb_per_rank": setup.cache_gb,
        "cache_blocks": setup.num_blocks,
        "block_size": setup.geometry.block_size,
        "num_drafts": setup.steps.max_k,
        "draft_schedule": [list(e) for e in setup.steps.schedule],
        "alphas": list(setup.alphas),
        "metrics": metrics,
        "slo": {"target_interactivity": slo.target_interactivity,
                "tput_per_gpu": None if math.isnan(slo.value) else slo.value, "reason": slo.reason,
                "tokens_per_dollar": per_dollar},
        "frontier": [{"concurrency": p.concurrency, "interactivity": p.interactivity,
                      "throughput_per_gpu": p.throughput_per_gpu} for p in frontier(sweep)],
        "points": [{k: p[k] for k in ("concurrency", "interactivity", "throughput_per_gpu")} for p in points],
        "point_details": points,
    }
