"""`python -m ablations.attribution SWEEP_DIR [--metric NAME] [--json FILE] [--allow-missing]`: attribute the
difference between all-off and all-on to the toggles of a sweep (the math: `ablations/attribution/shapley.py`).

The cells are every result.json under SWEEP_DIR. They must form one experiment: one design over one set of
players, every other setting equal (`setting_hash`); a foreign cell, a duplicate or a missing one is a
one-line error naming it (missing ones are listed and left out with --allow-missing). A failed cell counts
as missing, with its error. Writes attribution.csv, attribution.json and the plots next to the cells; the
multirun's callback (`AttributeCallback`, conf/design/_sweep.yaml) runs the same at the end of a sweep.
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ablations.attribution import shapley as att
from ablations.attribution.artefacts import Artefact, artefacts
from ablations.attribution.draws import Interval, first_order, indices_table, summarize
from ablations.attribution.draws import table as draws_table
from ablations.cells import Cell, find_cells, write_result
from ablations.experiment import design_cells, label

log = logging.getLogger("ablations")
CSV_FILE, JSON_FILE = "attribution.csv", "attribution.json"
BARS_FILE, HEATMAP_FILE = "attribution_bars.png", "interactions.png"
ASSUMPTIONS_FILE = "assumptions.png"      # which assumed figure moves each toggle's Shapley value (with draws)


class SweepError(ValueError):
    """Cells that do not make one experiment."""


@dataclass
class Sweep:
    """The cells of one experiment, checked: players, design, the metric per coalition and repeat."""

    players: tuple[str, ...]
    design: str
    metric: str
    values: dict[frozenset, dict[int, float]]
    expected: list[frozenset]
    repeats: int
    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    orders: list[tuple[str, ...]] | None = None
    artefacts: list[Artefact] = field(default_factory=list)
    draws: int = 0
    draw_values: dict[int, dict[frozenset, float]] = field(default_factory=dict)
    draw_figures: dict[int, dict[str, float]] = field(default_factory=dict)

    @property
    def game(self) -> att.Game:
        return att.Game(self.players, {c: tuple(v[r] for r in sorted(v)) for c, v in self.values.items() if v})


def _differences(a: dict[str, Any], b: dict[str, Any], keys=("workload", "model", "backend")) -> str:
    named = [f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
    return "; ".join(named) or "a non-toggle setting differs (setting_hash)"


def _draw_of(cell: Cell) -> int:
    """The draw of the assumed figures `cell` ran (-1: the point values, also for a cell from before draws)."""
    return int((cell.result.get("config", {}).get("ablation") or {}).get("draw", -1))


def collect(cells: list[Cell], metric: str | None = None, allow_missing: bool = False) -> Sweep:
    """Check `cells` make one experiment and gather `metric` (default: the experiment's) per coalition."""
    if not cells:
        raise SweepError("no result.json found")
    sweep_cells = [c for c in cells if c.ablation.get("cell")]
    if not sweep_cells:
        raise SweepError(f"{cells[0].where}: no cell of an ablation design (ablation.cell is empty in every result)")
    first = sweep_cells[0]
    for cell in sweep_cells[1:]:
        if cell.result.get("setting_hash") != first.result.get("setting_hash") or \
                cell.ablation.get("players") != first.ablation.get("players"):
            raise SweepError(f"foreign cell {cell.where}: {_differences(cell.result, first.result)} (first cell "
                             f"{first.where})")
    ablation = first.ablation
    players = tuple(ablation["players"])
    metric = metric or ablation.get("metric") or "total_throughput"
    design = ablation["design"]
    config = first.result.get("config", {}).get("ablation", {})
    orders = None
    if design == "shapley_sampled":
        orders = att.permutations(players, config.get("num_permutations", 6), config.get("seed", 0))
    expected = design_cells(design, players, num_permutations=config.get("num_permutations", 6),
                            seed=config.get("seed", 0))
    repeats = int(config.get("repeats", 1))
    draws = int(config.get("draws", 0))
    values: dict[frozenset, dict[int, float]] = {c: {} for c in expected}
    draw_values: dict[int, dict[frozenset, float]] = {d: {} for d in range(draws)}
    draw_figures: dict[int, dict[str, float]] = {}
    seen: dict[tuple, str] = {}
    failed = []
    for cell in sweep_cells:
        coalition = frozenset(cell.ablation.get("on", [])) if cell.ok else None
        draw = _draw_of(cell)
        key = (cell.ablation.get("cell"), cell.ablation.get("repeat", 0), draw)
        if key in seen:
            raise SweepError(f"duplicate cell {key[0]} repeat {key[1]}{f' draw {draw}' if draw >= 0 else ''}: "
                             f"{seen[key]} and {cell.where}")
        seen[key] = cell.where
        if not cell.ok:
            failed.append(f"{key[0]} (repeat {key[1]}, {cell.where}): {cell.result.get('error', 'no error recorded')}")
            continue
        if coalition not in values:
            raise SweepError(f"foreign cell {cell.where}: coalition {label(coalition, players)} is not in the "
                             f"{design} design over {', '.join(players)}")
        metrics = cell.result.get("metrics", {})
        if metric not in metrics:
            raise SweepError(f"{cell.where}: no metric {metric!r}; it has: {', '.join(sorted(metrics)) or 'none'}")
        if draw >= 0:
            if draw not in draw_values:
                raise SweepError(f"{cell.where}: draw {draw} is not in 0..{draws - 1} (ablation.draws)")
            draw_values[draw][coalition] = float(metrics[metric])
            drawn = cell.result["config"]["ablation"].get("drawn") or {}
            if draw_figures.setdefault(draw, drawn) != drawn:
                raise SweepError(f"{cell.where}: draw {draw}'s figures differ from another cell's of the same draw "
                                 f"(ablation.draw_seed or hardware.ranges changed mid-sweep)")
            continue
        values[coalition][key[1]] = float(metrics[metric])
    missing = [f"{label(c, players)} repeat {r}" for c in expected for r in range(repeats) if r not in values[c]]
    missing += [f"{label(c, players)} draw {d}" for d in range(draws) for c in expected if c not in draw_values[d]]
    point_cells = [c for c in sweep_cells if _draw_of(c) < 0]
    sweep = Sweep(players, design, metric, values, expected, repeats, missing, failed, orders,
                  artefacts(point_cells, players, metric), draws, draw_values, draw_figures)
    if missing and not allow_missing:
        failures = f"; failed: {'; '.join(failed)}" if failed else ""
        total = len(expected) * (repeats + draws)      # the slots `missing` counts: draws are not repeated
        summary = "; ".join(missing_summary(missing, len(expected)))
        raise SweepError(f"{len(missing)} of {total} cells missing: {summary}"
                         f"{failures} (--allow-missing attributes what is there)")
    return sweep


def missing_summary(missing: list[str], per_draw: int, named: int = 5) -> list[str]:
    """`missing` ("<cell> repeat <r>", "<cell> draw <d>") for a person: the point values' cells one by one, the
    draws' as one entry per run of consecutive draws missing as many of their `per_draw` cells (a lone draw's entry
    names its first `named`)."""
    out = [m for m in missing if " draw " not in m]
    by_draw: dict[int, list[str]] = {}
    for m in missing:
        if " draw " in m:
            cell, draw = m.rsplit(" draw ", 1)
            by_draw.setdefault(int(draw), []).append(cell)
    runs: list[list[int]] = []
    for draw in sorted(by_draw):
        if runs and runs[-1][-1] == draw - 1 and len(by_draw[runs[-1][0]]) == len(by_draw[draw]):
            runs[-1].append(draw)
        else:
            runs.append([draw])
    for run in runs:
        cells = by_draw[run[0]]
        which = f"draw {run[0]}" if len(run) == 1 else f"draws {run[0]}-{run[-1]}"
        count = f"all {per_draw}" if len(cells) == per_draw else f"{len(cells)} of {per_draw}"
        if len(run) > 1:
            out.append(f"{which}: {count} cells of each")
        elif len(cells) == per_draw:
            out.append(f"{which}: {count} cells")
        else:
            more = f" and {len(cells) - named} more" if len(cells) > named else ""
            out.append(f"{which}: {count} cells ({', '.join(cells[:named])}{more})")
    return out


def attribute(sweep: Sweep, bootstrap_num: int = 1000) -> dict[str, Any]:
    """The attribution of a checked sweep: Shapley values (exact, sampled or from the two ends), deltas,
    effects, interactions, intervals over repeats; quantities whose cells are missing are left out."""
    game = sweep.game
    players = sweep.players
    out: dict[str, Any] = {"metric": sweep.metric, "design": sweep.design, "players": list(players),
                           "cells": {label(c, players): list(v.values()) for c, v in sweep.values.items() if v},
                           "missing": sweep.missing,
                           "missing_summary": missing_summary(sweep.missing, len(sweep.expected)),
                           "failed": sweep.failed, "repeats": sweep.repeats}
    out["all_off"] = game.v(()) if game.has(()) else None
    out["all_on"] = game.v(players) if game.has(players) else None
    out["shapley"], out["shapley_error"], out["shapley_method"] = _shapley(game, sweep)
    for name, fn in (("leave_one_out", att.leave_one_out), ("add_one_in", att.add_one_in),
                     ("main_effects", att.main_effects)):
        out[name] = _maybe(fn, game)
    pairs = _maybe(att.interactions, game)
    if pairs is None:
        pairs = att.interactions_at_ends(game)
    out["interactions"] = {f"{a}+{b}": v for (a, b), v in pairs.items()}
    out["artefacts"] = [a.to_dict() for a in sweep.artefacts]
    out["draws"] = _draws(sweep, out["shapley"])
    out["flagged"] = flagged(out, sweep.artefacts)
    if sweep.repeats > 1 and out["shapley"] is not None:
        method = out["shapley_method"]
        intervals = att.bootstrap(game, lambda g: _shapley(g, sweep, method)[0], num=bootstrap_num)
        out["shapley_interval"] = {p: list(v) for p, v in intervals.items()}
    return out


def _draws(sweep: Sweep, point: dict[str, float] | None) -> dict[str, Any] | None:
    """The Shapley values of every complete draw (exact, as the point's), and each toggle's interval over them."""
    if not sweep.draws or point is None:
        return None
    per_draw = {}
    for draw, cells in sorted(sweep.draw_values.items()):
        try:
            per_draw[draw] = att.shapley(att.Game(sweep.players, {c: (v,) for c, v in cells.items()}))
        except att.MissingCells:
            continue
    if not per_draw:
        return {"num": sweep.draws, "complete": 0, "values": {}, "intervals": {}}
    intervals = summarize(point, list(per_draw.values()))
    figures = {d: sweep.draw_figures.get(d, {}) for d in per_draw}
    indices = first_order(list(per_draw.values()), list(figures.values()))
    return {"num": sweep.draws, "complete": len(per_draw), "values": {str(d): v for d, v in per_draw.items()},
            "figures": {str(d): f for d, f in figures.items()},
            "intervals": {p: iv.to_dict() for p, iv in intervals.items()}, "first_order": indices}


def flagged(out: dict[str, Any], found: list[Artefact]) -> dict[str, list[str]]:
    """Each work-removing toggle with a negative Shapley, add-one-in or leave-one-out value: the values that are
    negative (its drops, the cells and points behind them, are in `found`)."""
    out_flags = {}
    for player in dict.fromkeys(a.player for a in found):
        negative = [c for c in ("shapley", "add_one_in", "leave_one_out") if ((out.get(c) or {}).get(player) or 0) < 0]
        if negative:
            out_flags[player] = negative
    return out_flags


def _maybe(fn, game):
    try:
        return fn(game)
    except att.MissingCells:
        return None


def _shapley(game: att.Game, sweep: Sweep, method: str | None = None):
    if method in (None, "exact"):
        try:
            return att.shapley(game), None, "exact"
        except att.MissingCells:
            if method == "exact":
                raise
    if sweep.orders is not None and method in (None, "sampled"):
        try:
            value, error = att.shapley_sampled(game, sweep.orders)
            return value, error, "sampled"
        except att.MissingCells:
            pass
    loo, aoi = _maybe(att.leave_one_out, game), _maybe(att.add_one_in, game)
    if loo is None or aoi is None:
        return None, None, "none"
    return {p: (loo[p] + aoi[p]) / 2 for p in game.players}, None, "ends"


def table(out: dict[str, Any]) -> str:
    """The attribution as text: one line per toggle."""
    players = out["players"]
    head = f"{out['metric']}: all off {_num(out['all_off'])}, all on {_num(out['all_on'])} ({out['design']}, " \
           f"Shapley {out['shapley_method']})"
    cols = ("shapley", "add_one_in", "leave_one_out", "main_effects")
    lines = [head, f"{'toggle':<16}" + "".join(f"{c:>15}" for c in cols)]
    for p in players:
        lines.append(f"{p:<16}" + "".join(f"{_num((out.get(c) or {}).get(p)):>15}" for c in cols))
    if out["shapley"] is not None:
        lines.append(f"{'sum':<16}{_num(sum(out['shapley'].values())):>15}")
    for name, value in out["interactions"].items():
        lines.append(f"interaction {name}: {_num(value)}")
    draws = out.get("draws")
    if draws and draws["intervals"]:
        intervals = {p: Interval(**{k: (tuple(v) if k == "values" else v) for k, v in iv.items() if k != "resolved"})
                     for p, iv in draws["intervals"].items()}
        lines.append(draws_table(intervals, draws["complete"], draws.get("first_order"), of=draws["num"]))
        if draws.get("first_order"):
            lines.append(indices_table(draws["first_order"], draws["complete"]))
    for player, negative in out.get("flagged", {}).items():
        drops = [a for a in out["artefacts"] if a["player"] == player]
        lines.append(f"frontier artefact: {player}'s {', '.join(negative)} < 0 although it only removes work; "
                     f"{len(drops)} cell pair(s) drop when it is added, largest:")
        lines += [f"  {a['line']}" for a in drops[:3]]
    lines += [f"missing: {m}" for m in out.get("missing_summary", out["missing"])]
    lines += [f"failed: {f}" for f in out["failed"]]
    return "\n".join(lines)


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def write_outputs(out: dict[str, Any], directory: Path) -> list[Path]:
    """attribution.json, attribution.csv and the plots in `directory`; the paths written."""
    paths = [write_result(directory / JSON_FILE, out)]
    cols = ("shapley", "shapley_error", "add_one_in", "leave_one_out", "main_effects")
    with (directory / CSV_FILE).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["toggle", *cols, "interval_low", "interval_high"])
        for p in out["players"]:
            interval = (out.get("shapley_interval") or {}).get(p, [None, None])
            writer.writerow([p, *[(out.get(c) or {}).get(p) for c in cols], *interval])
    paths.append(directory / CSV_FILE)
    from ablations.attribution.plots import plot_attribution, plot_first_order

    paths += plot_attribution(out, directory / BARS_FILE, directory / HEATMAP_FILE)
    assumptions = plot_first_order(out, directory / ASSUMPTIONS_FILE)
    paths += [assumptions] if assumptions else []
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablations.attribution", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--metric", help="the metric to attribute (default: the experiment's ablation.metric)")
    parser.add_argument("--json", type=Path, help="also write the attribution JSON here")
    parser.add_argument("--allow-missing", action="store_true", help="attribute a partial design, listing the gaps")
    args = parser.parse_args(argv)
    try:
        out = attribute(collect(find_cells(args.sweep_dir), args.metric, args.allow_missing))
    except (SweepError, ValueError) as err:
        print(f"error: {args.sweep_dir}: {err}", file=sys.stderr)
        return 2
    print(table(out))
    paths = write_outputs(out, args.sweep_dir)
    if args.json:
        paths.append(write_result(args.json, out))
    print("wrote " + ", ".join(map(str, paths)))
    return 0


class AttributeCallback(Callback):
    """Hydra callback: attribute the multirun's cells when it ends (an incomplete sweep is reported, never
    raised: its finished cells stay)."""

    def __init__(self, metric: str | None = None) -> None:
        self.metric = metric

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            out = attribute(collect(find_cells(sweep_dir), self.metric, allow_missing=True))
        except (SweepError, ValueError) as err:
            log.error("attribution of %s: %s", sweep_dir, err)
            return
        log.info("%s", table(out))
        log.info("attribution written: %s", ", ".join(map(str, write_outputs(out, sweep_dir))))

