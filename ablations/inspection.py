"""What the notebooks in notebooks/ show, as functions they call: a sweep's cells as rows, the (interactivity,
throughput) points and frontiers of its headline cells, and every microbenchmark JSON as off/on rows with the
machine each number came from. Metrics come from the cells (`ablations.metrics` computed them), attribution
from `ablations.attribution.sweep`; nothing here recomputes either."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ablations.attribution.sweep import Sweep
from ablations.cells import Cell, find_cells
from ablations.experiment import label
from ablations.metrics import SweepPoint, frontier

SWEEP_ENV, BENCH_ENV = "K3_SWEEP_DIR", "K3_BENCH_PATHS"
ROW_KEYS = ("cell", "repeat", "status", "toggles", "config_hash")


def sweep_rows(cells: list[Cell]) -> list[dict[str, Any]]:
    """One row per cell: its design cell and repeat, status, toggle vector ("name=mode ..."), config hash
    (12 digits), then every metric it recorded (a failed cell: its error instead)."""
    rows = []
    for cell in cells:
        row: dict[str, Any] = {
            "cell": cell.ablation.get("cell") or "-", "repeat": cell.ablation.get("repeat", 0),
            "status": cell.result.get("status", "?"),
            "toggles": " ".join(f"{name}={v['mode']}" for name, v in (cell.result.get("toggles") or {}).items()),
            "config_hash": str(cell.result.get("config_hash", ""))[:12],
        }
        if cell.ok:
            row.update(cell.result.get("metrics") or {})
        else:
            row["error"] = cell.result.get("error", "no error recorded")
        rows.append(row)
    return rows


def text_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """`rows` as aligned text (floats to 4 significant digits); `columns` default: every key, first seen first."""
    if not rows:
        return "(no rows)"
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines)


def headline(sweep: Sweep) -> list[tuple[str, frozenset]]:
    """The coalitions a reader compares first: all off, each player alone, all on (those of the design)."""
    wanted = [frozenset()] + [frozenset([p]) for p in sweep.players] + [frozenset(sweep.players)]
    seen = dict.fromkeys(c for c in wanted if c in set(sweep.expected))
    return [(label(c, sweep.players), c) for c in seen]


def cell_points(cell: Cell) -> list[SweepPoint]:
    """A finished cell's (P90 interactivity, total throughput per GPU) points: one per concurrency point when the
    cell ran a concurrency sweep (`result["points"]`), else the one its metrics give."""
    points = cell.result.get("points")
    if points:
        return [SweepPoint(p["interactivity"], p["throughput_per_gpu"], p.get("concurrency")) for p in points]
    metrics = cell.result.get("metrics") or {}
    missing = [k for k in ("interactivity_p90", "total_throughput") if k not in metrics]
    if missing:
        raise ValueError(f"{cell.path}: no {', '.join(missing)} among its metrics ({', '.join(sorted(metrics))}); "
                         "a frontier needs a serving backend's cells")
    return [SweepPoint(float(metrics["interactivity_p90"]), float(metrics["total_throughput"]))]


def frontiers(cells: list[Cell], sweep: Sweep) -> dict[str, dict[str, list[SweepPoint]]]:
    """Per headline coalition: its points (every repeat) and their Pareto frontier (`metrics.frontier`)."""
    by_coalition: dict[frozenset, list[Cell]] = {}
    for cell in cells:
        if cell.ok and cell.ablation.get("cell"):
            by_coalition.setdefault(frozenset(cell.ablation.get("on", [])), []).append(cell)
    out = {}
    for name, coalition in headline(sweep):
        points = [p for cell in by_coalition.get(coalition, []) for p in cell_points(cell)]
        out[name] = {"points": points, "frontier": frontier(points)}
    return out


def alone_vs_together(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Per player of an attribution (`attribute.attribute`'s result): what it buys alone (added to all off),
    last in (removed from all on), and its Shapley value; None where the design lacks the cells."""
    return [{"toggle": p, "alone": (out.get("add_one_in") or {}).get(p),
             "last_in": (out.get("leave_one_out") or {}).get(p), "shapley": (out.get("shapley") or {}).get(p)}
            for p in out["players"]]


def load_sweep(sweep_dir: str | Path) -> list[Cell]:
    """The cells under `sweep_dir` (every result.json); a missing directory or no cell is a ValueError."""
    cells = find_cells(Path(sweep_dir))
    if not cells:
        raise ValueError(f"{sweep_dir}: no result.json under it")
    return cells


# Microbenchmarks: one row per (optimization, case) with off, on, on's gain and where it was measured.

def _machine(top: dict[str, Any], row: dict[str, Any]) -> str | None:
    """The device a row names, else its file's CPU model with the ISA when known."""
    device = row.get("device") or top.get("device")
    if device:
        return device
    model, isa = top.get("cpu_model"), top.get("isa") or top.get("cpu_isa")
    return f"{model} ({isa})" if model and isa else model


def _row(source: str, optimization: str, case: str, quantity: str, off: float, on: float, machine: str | None
         ) -> dict[str, Any]:
    better_low = quantity == "seconds"
    gain = (off / on if on else math.inf) if better_low else (on / off if off else math.inf)
    return {"optimization": optimization, "case": case, "quantity": quantity, "off": off, "on": on, "gain": gain,
            "machine": machine, "source": source}


def microbench_rows(path: str | Path) -> list[dict[str, Any]]:
    """Off/on rows of one microbenchmark JSON: pytest-benchmark's `--benchmark-json` (measured runs) or
    `python -m opts bench NAME --json` of any optimization (times; cache_retention's hit rates per capacity;
    draft_length's goodput per bucket, fixed K as off). `gain` is on's: off/on for seconds, on/off otherwise."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a benchmark JSON: {err}") from None
    src = str(path)
    rows: list[dict[str, Any]] = []
    if isinstance(data, dict) and "benchmarks" in data:
        for bench in data["benchmarks"]:
            info = bench.get("extra_info") or {}
            if "off_median_s" not in info:
                raise ValueError(f"{path}: {bench.get('name')}: no off/on timing in extra_info (a run with "
                                 "--benchmark-disable times nothing; run with --benchmark-enable)")
            test_file = bench.get("fullname", "").split("::")[0]
            name = Path(test_file).stem.removeprefix("test_") or "?"
            rows.append(_row(src, name, info.get("case", bench.get("name")), "seconds", info["off_median_s"],
                             info["on_median_s"], info.get("device")))
        return rows
    if not isinstance(data, dict) or "optimization" not in data or "cases" not in data:
        raise ValueError(f"{path}: neither pytest-benchmark JSON (benchmarks) nor `python -m opts bench --json` "
                         "output (optimization, cases)")
    name = data["optimization"]
    for case in data["cases"]:
        machine = _machine(data, case)
        if "off_s" in case:
            rows.append(_row(src, name, case["case"], "seconds", case["off_s"], case["on_s"], machine))
        elif "modes" in case:
            modes = case["modes"]
            if "off" in modes and "on" in modes:
                rows.append(_row(src, name, case["case"], "seconds", modes["off"]["median_s"], modes["on"]["median_s"],
                                 machine))
        elif "hit_rates" in case:
            rates = case["hit_rates"]
            for fraction, off, on in zip(case["fractions"], rates.get("off", []), rates.get("on", []), strict=False):
                if off is not None and on is not None and off > 0:
                    rows.append(_row(src, name, f"{case['case']} at {fraction:g} of working set", "hit rate", off,
                                     on, machine))
        elif "rows" in case:
            for r in case["rows"]:
                lo, hi = r["bucket"]
                rows.append(_row(src, name, f"{case['case']} {r['profile']} batch {lo}-{hi}", "goodput",
                                 r["fixed_goodput"], r["chosen_goodput"], machine))
        else:
            raise ValueError(f"{path}: case {case.get('case')!r} of {name}: no off/on numbers (off_s/on_s, modes, "
                             "hit_rates or rows)")
    return rows


def load_microbench(paths: str | Path | list[str | Path]) -> list[dict[str, Any]]:
    """The rows of every JSON given: files, or folders searched for *.json; a path with none is a ValueError."""
    items = paths if isinstance(paths, list) else [p for p in str(paths).split(",") if p]
    files: list[Path] = []
    for item in map(Path, items):
        found = sorted(item.rglob("*.json")) if item.is_dir() else [item] if item.is_file() else []
        if not found:
            raise ValueError(f"{item}: no benchmark JSON there")
        files += found
    return [row for f in files for row in microbench_rows(f)]
