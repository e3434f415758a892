"""The simulator's report: Kimi K3 on `agentx` on each node, as stock vLLM serves it there (each toggle at its
platform's `STOCK_MODES`), all toggles off and every toggle the simulator models on; the frontier, the throughput
per GPU at the target interactivity, tokens per dollar, and how far the all-off headline moves when each figure with
a range is at either end of it, and each assumed one at ±20%."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from functools import cache
from typing import Any

from ablations.backends.sim.cell import mean_context, run_sim_cell, sim_setup
from ablations.backends.sim.checks import wired as sim_wired
from ablations.backends.sim.explain import headline_steps, text
from ablations.config import AppConfig, compose_app
from ablations.hardware import FIGURES, HardwareConfig
from ablations.workload import WorkloadConfig, load_workload
from opts.registry import OPTIMIZATIONS

HARDWARE = ("mi355x_x8", "b300_x8")
MODEL, WORKLOAD = "kimi_k3", "agentx"
STEP = 0.2
OPTS = ("stock", "all_off", "all_on")
SENSITIVITY = ("mi355x_x8",)          # the nodes whose all-off headline the report moves by default


def on_overrides(platform: str) -> list[str]:
    """Every toggle the simulator models on and off for on `platform`, switched on."""
    return [f"opts/{name}=on" for name in sim_wired(platform)]


def compose(hardware: str, opts: str, overrides: tuple[str, ...] = ()) -> AppConfig:
    """The app config of one report cell."""
    if opts not in OPTS:
        raise ValueError(f"opts: invalid value {opts!r}; valid: {', '.join(OPTS)}")
    base = ["backend=sim", f"model={MODEL}", f"hardware={hardware}", f"workload={WORKLOAD}"]
    if opts == "all_off":
        return compose_app([*base, *overrides])
    platform = compose_app(base).hardware.platform
    if opts == "stock":
        modes = stock_modes(platform)
        return compose_app([*base, *(f"opts/{n}={mode}" for n, mode in modes.items() if mode not in (None, "off")),
                            *overrides])
    return compose_app([*base, *on_overrides(platform), *overrides])


def stock_modes(platform: str) -> dict[str, str | None]:
    """Each toggle's mode that is stock vLLM on `platform` (its package's STOCK_MODES), None where no mode is: the
    stock cell leaves that toggle out, so the simulator runs the node's own stock path (aiter_mla on CUDA: the
    MLA decode vLLM picks there; fusion on ROCm: which mode is stock is open, issue 49, and nothing is fused)."""
    return {name: opt.stock_modes.get(platform) for name, opt in OPTIMIZATIONS.items()}


def cell_toggles(app: AppConfig, opts: str) -> dict[str, Any]:
    """The toggle vector of a report cell: every toggle, or for the stock cell those with a stock mode."""
    toggles = app.toggles()
    if opts != "stock":
        return toggles
    modes = stock_modes(app.hardware.platform)
    return {name: config for name, config in toggles.items() if modes[name] is not None}


def assumed(hw: HardwareConfig) -> list[str]:
    """The profile's values whose source says assumed ("launch_us", "efficiency.gemm", ...)."""
    return hw.assumed


def moves(hw: HardwareConfig) -> list[tuple[str, str, float]]:
    """(value, label, new value) of every sensitivity cell: each figure with a range at its low and high end, each
    assumed one also at ±20% (an efficiency at most 1)."""
    out = []
    for key in sorted(set(hw.ranges) | set(hw.assumed)):
        if key in hw.ranges:
            low, high = hw.ranges[key]
            out += [(key, "low", low), (key, "high", high)]
        if key in hw.assumed:
            value = hw.value(key)
            out += [(key, f"x{1 - STEP:g}", value * (1 - STEP)), (key, f"x{1 + STEP:g}", value * (1 + STEP))]
    return out


def with_value(hw: HardwareConfig, key: str, value: float) -> HardwareConfig:
    """`hw` with the value `key` (a figure or "efficiency.<class>") set to `value` (an efficiency at most 1, a bus
    bandwidth at most the link's)."""
    if key.startswith("efficiency."):
        name = key.removeprefix("efficiency.")
        return dataclasses.replace(hw, efficiency={**hw.efficiency, name: min(1.0, value)})
    if key not in FIGURES:
        raise ValueError(f"{key}: not a figure of hardware {hw.name}; valid: {', '.join(FIGURES)}, efficiency.<class>")
    if key.endswith("_busbw_gb_s") and hw.link_bandwidth_gb_s:
        value = min(value, hw.link_bandwidth_gb_s)
    return dataclasses.replace(hw, **{key: value})


def scaled(hw: HardwareConfig, key: str, factor: float) -> HardwareConfig:
    """`hw` with the value `key` times `factor` (an efficiency at most 1)."""
    return with_value(hw, key, hw.value(key) * factor)


@cache
def _trace(workload: str):
    return load_workload(WorkloadConfig(**json.loads(workload)))


def run_cell(hardware: str, opts: str, value: str | None = None, label: str = "", new: float = 0.0,
             overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """One report cell (`value` set to `new`, the sensitivity's `label`ed move: those stop at the bracket)."""
    app = compose(hardware, opts, overrides)
    hw = app.hardware if value is None else with_value(app.hardware, value, new)
    trace = _trace(json.dumps(dataclasses.asdict(app.workload), sort_keys=True))
    # the report runs its cells side by side; the sensitivity's only search the bracket
    backend = dataclasses.replace(app.backend, workers=1,
                                  bracket_from=app.backend.concurrency[0] if value is not None else 0)
    toggles = cell_toggles(app, opts)
    cell = run_sim_cell(backend, app.model.name, hw, toggles, trace)
    slo = cell["slo"]["tput_per_gpu"]
    return {"hardware": hardware, "opts": opts, "value": value, "label": label, "new": new,
            "toggles": {name: toggles[name].mode if name in toggles else "stock" for name in app.toggles()},
            "draft_schedule": cell["draft_schedule"],
            "tput_per_gpu_at_slo": slo, "slo_reason": cell["slo"]["reason"],
            "tokens_per_dollar": cell["slo"]["tokens_per_dollar"], "price_per_gpu_hour": hw.price_per_gpu_hour,
            "target_interactivity": cell["slo"]["target_interactivity"], "frontier": cell["frontier"],
            "points": cell["points"], "cache_gb_per_rank": cell["cache_gb_per_rank"]}


def _task(args: tuple) -> dict[str, Any]:
    return run_cell(*args)


def report(hardware: tuple[str, ...] = HARDWARE, *, sensitivity: tuple[str, ...] = SENSITIVITY,
           workers: int | None = None, overrides: tuple[str, ...] = (), progress: Callable[[str], None] = print
           ) -> list[dict[str, Any]]:
    """One row per node and toggle set (`OPTS`); each all-off row of a node in `sensitivity` carries the headline
    with each of its profile's moves (`moves`). Cells run on `workers` processes (default: the cores; 1: in this
    process)."""
    tasks = [(hw, opts, None, "", 0.0, overrides) for hw in hardware for opts in OPTS]
    for hw in hardware:
        if hw in sensitivity:
            tasks += [(hw, "all_off", *move, overrides) for move in moves(compose(hw, "all_off", overrides).hardware)]
    workers = workers or os.cpu_count() or 1
    done: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else nullcontext() as pool:
        for k, cell in enumerate((pool.map if pool else map)(_task, tasks), 1):
            done.append(cell)
            what = f"{cell['value']} {cell['label']} ({cell['new']:g})" if cell["value"] else cell["opts"]
            headline = cell["tput_per_gpu_at_slo"]
            progress(f"sim report: [{k}/{len(tasks)}] {cell['hardware']} {what}: "
                     + (f"{headline:.1f} tokens/s/GPU at {cell['target_interactivity']:g} tok/s/user"
                        if headline is not None else cell["slo_reason"]))
    rows = [c for c in done if c["value"] is None]
    for row in rows:
        if row["opts"] != "all_off" or row["hardware"] not in sensitivity:
            continue
        hw = compose(row["hardware"], "all_off", overrides).hardware
        moved = {}
        for c in done:
            if c["value"] is not None and c["hardware"] == row["hardware"]:
                by = moved.setdefault(c["value"], {"value": c["value"], "at": hw.value(c["value"]),
                                                   "assumed": c["value"] in hw.assumed})
                by[c["label"]] = {"set": c["new"], "tput_per_gpu_at_slo": c["tput_per_gpu_at_slo"]}
                if c["tput_per_gpu_at_slo"] is None:
                    by[c["label"]]["reason"] = c["slo_reason"]
        row["sensitivity"] = [moved[k] for k in sorted(moved)]
    for row in rows:
        for key in ("value", "label", "new"):
            row.pop(key)
    return rows


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def _moved(entry: dict[str, Any] | None, base: float | None) -> str:
    if entry is None:
        return ""
    v = entry["tput_per_gpu_at_slo"]
    change = "" if v is None or base is None else f" ({v / base - 1:+.1%})"
    why = f" ({entry['reason'].split(':')[0]})" if "reason" in entry else ""
    return f"{entry['set']:g}: {_num(v)}{change}{why}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown: the headline per node and toggle set (with draft_length's K per batch size), then the
    sensitivity of each all-off headline that has one."""
    lines = ["| hardware | opts | tokens/s/GPU at SLO | tokens per $ | K by batch size | frontier (concurrency: "
             "tok/s/user, tok/s/GPU) |", "|---|---|---|---|---|---|"]
    for r in rows:
        front = "; ".join(f"{p['concurrency']}: {p['interactivity']:.1f}, {p['throughput_per_gpu']:,.0f}"
                          for p in r["frontier"])
        ks = ", ".join(f"{lo}-{hi}: {k}" if lo != hi else f"{lo}: {k}" for lo, hi, k in r["draft_schedule"])
        lines.append(f"| {r['hardware']} | {r['opts']} | {_num(r['tput_per_gpu_at_slo'])} | "
                     f"{_num(r['tokens_per_dollar'])} | {ks} | {front} |")
    for r in rows:
        if "sensitivity" not in r:
            continue
        base = r["tput_per_gpu_at_slo"]
        lines += ["", f"{r['hardware']}, all off: the headline ({_num(base)} tokens/s/GPU) with each figure at the "
                  f"ends of its range, and each assumed one at -{STEP:.0%} and +{STEP:.0%}", "",
                  f"| figure | value | source | low | high | x{1 - STEP:g} | x{1 + STEP:g} |",
                  "|---|---|---|---|---|---|---|"]
        for s in r["sensitivity"]:
            cells = [_moved(s.get(k), base) for k in ("low", "high", f"x{1 - STEP:g}", f"x{1 + STEP:g}")]
            lines.append(f"| {s['value']} | {s['at']:g} | {'assumed' if s['assumed'] else 'sourced'} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def explain(hardware: tuple[str, ...] = HARDWARE, opts: str = "all_off", sessions: int = 6,
            overrides: tuple[str, ...] = ()) -> str:
    """Each node's decode step and prefill chunk at the headline's point (`sessions` live sessions, each at the
    workload's mean context; a chunk of the scheduler's token budget), explained (`explain.py`)."""
    out = []
    for name in hardware:
        app = compose(name, opts, overrides)
        trace = _trace(json.dumps(dataclasses.asdict(app.workload), sort_keys=True))
        setup = sim_setup(app.backend, app.model.name, app.hardware, cell_toggles(app, opts), trace)
        model = setup.steps.models[setup.steps.k(sessions)]
        steps = headline_steps(model, sessions, mean_context(trace), app.backend.max_num_batched_tokens)
        out.append(text(f"{name} ({opts}, K = {model.num_drafts})", steps))
    return "\n\n".join(out)
