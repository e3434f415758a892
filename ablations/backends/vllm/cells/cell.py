"""One run of the tiny model on vLLM with a toggle vector: start the engine, replay the workload's first requests
at their schedule's times (`timed_replay.py`), and report what ran and what it measured: per-request records and
their metrics (`ablations.metrics`), the kernel calls counted in every vLLM process and the patches each process
installed."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ablations.backends.vllm.cells.timed_replay import ReplayLimits, timed_replay
from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.backends.vllm.in_vllm.counters import counting_into, read_counts
from ablations.backends.vllm.in_vllm.steps import read_steps
from ablations.backends.vllm.in_vllm.toggles import read_records
from ablations.backends.vllm.launch.engine import EngineConfig, engine_config, engine_kwargs, open_llm
from ablations.metrics import cell_metrics
from ablations.workload.config import WorkloadConfig, build_schedule
from ablations.workload.trace import Trace

log = logging.getLogger("ablations")
PROCESS_DIR = "vllm_processes"
NUM_DEVICES = 1     # the CPU engine runs on one device: throughput "per GPU" is per engine here


def first_requests(trace: Trace, num_requests: int) -> Trace:
    """The trace cut to its first `num_requests` requests (a session keeps the turns that fall inside)."""
    if not trace.requests:
        raise ValueError(f"workload {trace.source or ''}: no requests to replay")
    return Trace(trace.requests[:num_requests], trace.block_size, trace.source)


def fired(cfg: EngineConfig, counts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per toggle: its counted routes (calls, or why the engine never runs one) and whether every route the
    engine runs fired; `fired` None when the setting counts nothing (stock, or engine arguments only)."""
    kwargs = engine_kwargs(cfg)
    out = {}
    for name, setting in cfg.settings().items():
        routes: dict[str, dict[str, Any]] = {}
        for patch in setting.patches:
            if patch.counter:
                idle = patch.idle_in(kwargs)
                routes[patch.counter] = {"calls": counts.get(patch.counter, 0), **({"idle": idle} if idle else {})}
        live = [c for c, route in routes.items() if "idle" not in route]
        out[name] = {"mode": cfg.toggles[name]["mode"], "routes": routes,
                     "fired": all(routes[c]["calls"] > 0 for c in live) if live else None}
    return out


def not_fired(report: dict[str, dict[str, Any]]) -> list[str]:
    """One line per toggle whose setting acts but never ran: the toggle, its mode and its silent routes."""
    lines = []
    for name, entry in report.items():
        if entry["fired"] is False:
            silent = [c for c, route in entry["routes"].items() if route["calls"] == 0 and "idle" not in route]
            lines.append(f"{name}={entry['mode']} never fired ({', '.join(f'{c}: 0 calls' for c in silent)})")
    return lines


def run_cell(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any], trace: Trace, out_dir: Path,
             workload: WorkloadConfig, model_cache: str = "") -> dict[str, Any]:
    """Start the engine for `toggles`, replay the workload's first `backend.num_requests` requests by its
    schedule, stop it; the cell's result. Every vLLM process writes its counts and patch record under
    `out_dir/vllm_processes`, the scheduler's process its steps (`steps.py`)."""
    cfg = engine_config(backend, model, toggles, model_cache)
    cut = first_requests(trace, backend.num_requests)
    schedule = build_schedule(workload, cut)
    limits = ReplayLimits(backend.max_prompt_tokens, backend.max_tokens)
    process_dir = out_dir / PROCESS_DIR
    step = max(1, len(cut.requests) // 4)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            log.info("vllm: %d/%d requests finished", done, total)

    with counting_into(process_dir):
        log.info("vllm: starting %s engine (%s) with toggles %s", model.name, backend.platform, cfg.toggles)
        t0 = time.perf_counter()
        with open_llm(cfg) as llm:
            start_s = time.perf_counter() - t0
            log.info("vllm: engine up in %.1f s; replaying %d requests (%s schedule)", start_s, len(cut.requests),
                     type(schedule).__name__)
            records, seen = timed_replay(llm, cut, schedule, model.vocab_size, limits, progress=progress)
    metrics = cell_metrics(records, NUM_DEVICES)
    log.info("vllm: %d requests in %.2f s: %.1f tokens/s, TTFT p50 %.3f s, hit rate %.3f", len(records),
             seen["seconds"], metrics["total_throughput"], metrics["ttft_p50_s"], metrics["prefix_hit_rate"])
    kwargs = engine_kwargs(cfg)
    counts = read_counts(process_dir)
    return {
        "toggles": cfg.toggles,
        "platform": backend.platform,
        "engine_args": {k: v for k, v in kwargs.items() if k != "model"},
        "env": {name: setting.env for name, setting in cfg.settings().items() if setting.env},
        "num_requests": len(records),
        "prompt_tokens": sum(r.input_tokens for r in records),
        "output_tokens": sum(r.output_tokens for r in records),
        "engine_start_s": start_s,
        "replay_s": seen["seconds"],
        "metrics": metrics,
        "requests": [{"arrival_s": r.arrival_s, "first_token_s": r.first_token_s, "finish_s": r.finish_s,
                      "input_tokens": r.input_tokens, "cached_tokens": r.cached_tokens,
                      "output_tokens": r.output_tokens} for r in records],
        "output_token_ids": seen["outputs"],
        "kernel_counts": counts,
        "fired": fired(cfg, counts),
        "processes": read_records(process_dir),
        "steps": read_steps(process_dir),
    }
