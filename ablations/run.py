"""One ablation cell, run: build its workload, run it on its backend (the simulator, vLLM in process or served,
or a GPU node's printed commands), write its `result.json` atomically (`ablations/cells.py`). The Hydra app
(`python -m ablations`) and the fidelity check both run cells through `run`."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from pathlib import Path

from ablations.backends.sim.cell import run_sim_cell
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.cells.cell import not_fired
from ablations.backends.vllm.cells.cell import run_cell as run_vllm_cell
from ablations.backends.vllm.cells.commands import COMMANDS_FILE, gpu_commands, script
from ablations.backends.vllm.cells.serve_cell import run_serve_cell
from ablations.cells import config_hash, environment, setting_hash, write_result
from ablations.config import AppConfig
from ablations.workload import WorkloadConfig, format_stats, load_workload, trace_stats, write_trace
from ablations.workload.trace import Trace
from opts.registry import vector_dict

log = logging.getLogger("ablations")
TRACE_FILE = "workload.jsonl"
# What a cell without a backend measures: its workload's statistics.
WORKLOAD_METRICS = ("requests", "theoretical_prefix_reuse")


def identity(app: AppConfig, config: dict, players: tuple[str, ...]) -> dict:
    """What a result says about the run before it runs: config, hashes, experiment, toggle vector, where."""
    ablation = app.ablation
    return {
        "schema": 1,
        "workload": app.workload.name,
        "model": app.model.name if app.backend is not None else None,
        "backend": app.backend.name if app.backend is not None else None,
        "toggles": vector_dict(app.toggles()),
        "ablation": {"design": ablation.design, "players": list(players), "cell": ablation.cell,
                     "on": [p for p in players if p in _on(app, players)], "repeat": ablation.repeat,
                     "metric": ablation.metric},
        "config": config,
        "config_hash": config_hash(config),
        "setting_hash": setting_hash(config, list(players)),
        "tags": list(app.tags),
        "environment": environment(),
    }


_WORKLOADS: dict[tuple, tuple[Trace, dict]] = {}


def workload(cfg: WorkloadConfig) -> tuple[Trace, dict]:
    """The trace `cfg` names and its statistics (a copy), built once per process: the cells of a sweep on one
    worker share them (about 1.1 s a cell for agentx). Keyed by every field, and a trace file by its size and
    modification time."""
    path = cfg.resolved_path
    stat = path.stat() if path is not None and path.is_file() else None
    stamp = (stat.st_size, stat.st_mtime_ns) if stat is not None else None
    key = (json.dumps(dataclasses.asdict(cfg), sort_keys=True, default=str), str(path), stamp)
    if key not in _WORKLOADS:
        trace = load_workload(cfg)
        _WORKLOADS.clear()
        _WORKLOADS[key] = (trace, trace_stats(trace))
    trace, stats = _WORKLOADS[key]
    return trace, copy.deepcopy(stats)


def _on(app: AppConfig, players: tuple[str, ...]) -> set[str]:
    vector = app.toggles()
    return {name for name in players if vector[name].mode == app.ablation.on_mode(name)}


def run(app: AppConfig, out_dir: Path, config: dict | None = None, players: tuple[str, ...] = ()) -> dict:
    """Build the workload, run the cell, write its result file into `out_dir` atomically, return the result."""
    start = time.perf_counter()
    config = config if config is not None else {}
    trace, stats = workload(app.workload)
    result = {**identity(app, config, players), "status": "ok", "stats": stats,
              "metrics": {k: stats[k] for k in WORKLOAD_METRICS if k in stats}}
    log.info("workload %s:\n%s", app.workload.name, format_stats(stats))
    out_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(app.backend, SimBackendConfig):
        cell = run_sim_cell(app.backend, app.model.name, app.hardware, app.toggles(), trace)
        result["cell"] = cell
        result["metrics"] = cell["metrics"]
        result["points"] = cell["points"]
    elif app.backend is not None and app.backend.print_commands:
        commands = gpu_commands(app.backend, app.model, app.hardware, result["toggles"], trace, out_dir)
        text = script(commands, app.backend.client)
        (out_dir / COMMANDS_FILE).write_text(text)
        print(text, end="")
        log.info("commands for %s (%s client): %s", app.hardware.name, app.backend.client, out_dir / COMMANDS_FILE)
        result["commands"] = commands
    elif app.backend is not None:
        if app.model.checkpoint and app.backend.platform == "cpu":
            raise ValueError(f"model.checkpoint: {app.model.checkpoint!r} is a full-size model, not one vLLM-CPU "
                             "runs here; backend.print_commands=true prints its commands for a GPU node")
        if app.backend.mode == "serve":
            cell = run_serve_cell(app.backend, app.model, result["toggles"], trace, out_dir, app.paths.model_cache)
        else:
            cell = run_vllm_cell(app.backend, app.model, result["toggles"], trace, out_dir, app.workload,
                            app.paths.model_cache)
        result["cell"] = cell
        result["metrics"] = cell["metrics"]
        result["fired"] = cell["fired"]
        if "points" in cell:
            result["points"] = cell["points"]
        silent = not_fired(cell["fired"])
        if silent:
            raise RuntimeError("; ".join(silent))
    result["seconds"] = time.perf_counter() - start
    if app.save_trace:
        result["trace_file"] = str(write_trace(trace, out_dir / TRACE_FILE))
    path = write_result(out_dir / app.result_file, result)
    log.info("result: %s", path)
    return result
