"""The simulator's report: Kimi K3 on `agentx` on each node, all toggles off and every toggle the simulator models
on; the frontier, the throughput per GPU at the target interactivity, tokens per dollar, and how far the headline
moves when each value a profile marks assumed moves by ±20%."""

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

from ablations.backends.sim.cell import run_sim_cell
from ablations.config import AppConfig, compose_app, sim_wired
from ablations.hardware import FIGURES, HardwareConfig
from ablations.workload import WorkloadConfig, load_workload

HARDWARE = ("mi355x_x8", "b300_x8")
MODEL, WORKLOAD = "kimi_k3", "agentx"
STEP = 0.2
OPTS = ("all_off", "all_on")


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
    return compose_app([*base, *on_overrides(compose_app(base).hardware.platform), *overrides])


def assumed(hw: HardwareConfig) -> list[str]:
    """The profile's values whose source says assumed ("launch_us", "efficiency.gemm", ...)."""
    return sorted(key for key, source in hw.sources.items() if "assumed" in source.lower())


def scaled(hw: HardwareConfig, key: str, factor: float) -> HardwareConfig:
    """`hw` with the value `key` (a figure or "efficiency.<class>") times `factor` (an efficiency at most 1)."""
    if key.startswith("efficiency."):
        name = key.removeprefix("efficiency.")
        return dataclasses.replace(hw, efficiency={**hw.efficiency, name: min(1.0, hw.efficiency[name] * factor)})
    if key not in FIGURES:
        raise ValueError(f"{key}: not a figure of hardware {hw.name}; valid: {', '.join(FIGURES)}, efficiency.<class>")
    return dataclasses.replace(hw, **{key: getattr(hw, key) * factor})


@cache
def _trace(workload: str):
    return load_workload(WorkloadConfig(**json.loads(workload)))


def run_cell(hardware: str, opts: str, value: str | None = None, factor: float = 1.0,
             overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    """One report cell (`value` scaled by `factor`, for the sensitivity: those stop at the bracket)."""
    app = compose(hardware, opts, overrides)
    hw = app.hardware if value is None else scaled(app.hardware, value, factor)
    trace = _trace(json.dumps(dataclasses.asdict(app.workload), sort_keys=True))
    # the report runs its cells side by side; the sensitivity's only search the bracket
    backend = dataclasses.replace(app.backend, workers=1,
                                  bracket_from=app.backend.concurrency[0] if value is not None else 0)
    cell = run_sim_cell(backend, app.model.name, hw, app.toggles(), trace)
    slo = cell["slo"]["tput_per_gpu"]
    return {"hardware": hardware, "opts": opts, "value": value, "factor": factor,
            "toggles": {name: config.mode for name, config in app.toggles().items()},
            "tput_per_gpu_at_slo": slo, "slo_reason": cell["slo"]["reason"],
            "tokens_per_dollar": cell["slo"]["tokens_per_dollar"], "price_per_gpu_hour": hw.price_per_gpu_hour,
            "target_interactivity": cell["slo"]["target_interactivity"], "frontier": cell["frontier"],
            "points": cell["points"], "cache_gb_per_rank": cell["cache_gb_per_rank"]}


def _task(args: tuple) -> dict[str, Any]:
    return run_cell(*args)


def report(hardware: tuple[str, ...] = HARDWARE, *, sensitivity: bool = True, workers: int | None = None,
           overrides: tuple[str, ...] = (), progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One row per node and toggle set (`OPTS`); with `sensitivity`, each all-off row carries the headline with
    each assumed value of its profile at -20% and +20%. Cells run on `workers` processes (default: the cores; 1:
    in this process)."""
    tasks = [(hw, opts, None, 1.0, overrides) for hw in hardware for opts in OPTS]
    if sensitivity:
        for hw in hardware:
            for value in assumed(compose(hw, "all_off", overrides).hardware):
                tasks += [(hw, "all_off", value, 1 - STEP, overrides), (hw, "all_off", value, 1 + STEP, overrides)]
    workers = workers or os.cpu_count() or 1
    done: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else nullcontext() as pool:
        for k, cell in enumerate((pool.map if pool else map)(_task, tasks), 1):
            done.append(cell)
            what = f"{cell['value']} x{cell['factor']:g}" if cell["value"] else cell["opts"]
            headline = cell["tput_per_gpu_at_slo"]
            progress(f"sim report: [{k}/{len(tasks)}] {cell['hardware']} {what}: "
                     + (f"{headline:.1f} tokens/s/GPU at {cell['target_interactivity']:g} tok/s/user"
                        if headline is not None else cell["slo_reason"]))
    rows = [c for c in done if c["value"] is None]
    for row in rows:
        if row["opts"] != "all_off" or not sensitivity:
            continue
        moved = {}
        for c in done:
            if c["value"] is not None and c["hardware"] == row["hardware"]:
                by = moved.setdefault(c["value"], {})
                by[f"x{c['factor']:g}"] = c["tput_per_gpu_at_slo"]
                if c["tput_per_gpu_at_slo"] is None:
                    by[f"x{c['factor']:g}_reason"] = c["slo_reason"]
        row["sensitivity"] = [{"value": value, **by} for value, by in sorted(moved.items())]
    for row in rows:
        for key in ("value", "factor"):
            row.pop(key)
    return rows


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown: the headline per node and toggle set, then the sensitivity of each all-off headline."""
    lines = ["| hardware | opts | tokens/s/GPU at SLO | tokens per $ | frontier (concurrency: tok/s/user, tok/s/GPU) |",
             "|---|---|---|---|---|"]
    for r in rows:
        front = "; ".join(f"{p['concurrency']}: {p['interactivity']:.1f}, {p['throughput_per_gpu']:,.0f}"
                          for p in r["frontier"])
        lines.append(f"| {r['hardware']} | {r['opts']} | {_num(r['tput_per_gpu_at_slo'])} | "
                     f"{_num(r['tokens_per_dollar'])} | {front} |")
    for r in rows:
        if "sensitivity" not in r:
            continue
        base = r["tput_per_gpu_at_slo"]
        lines += ["", f"{r['hardware']}, all off: the headline ({_num(base)} tokens/s/GPU) with each assumed value "
                  f"at -{STEP:.0%} and +{STEP:.0%}", "",
                  f"| value | x{1 - STEP:g} | x{1 + STEP:g} |", "|---|---|---|"]
        for s in r["sensitivity"]:
            cells = []
            for key in (f"x{1 - STEP:g}", f"x{1 + STEP:g}"):
                v = s.get(key)
                change = "" if v is None or base is None else f" ({v / base - 1:+.1%})"
                why = f" ({s[key + '_reason'].split(':')[0]})" if key + "_reason" in s else ""
                cells.append(f"{_num(v)}{change}{why}")
            lines.append(f"| {s['value']} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
