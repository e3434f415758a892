"""The frontier's artefacts: a toggle whose mode only removes work (`Optimization.removes_work`) cannot make a
cell slower, so where adding it lowers the metric (v(S + i) < v(S)) the drop comes from how the headline is read
off the cell's points (which concurrencies bracket the target interactivity), not from the toggle.

`artefacts(cells, players, metric)` finds every such pair of cells for every player whose on mode removes work,
and names, per pair, the two cells, their values, the points that bracket the target in each, the
concurrencies whose point crossed the target between them, and, where the bracket stayed, the bracket's points
that fell themselves (throughput, and the prefix hit rate where the cell recorded it: a cache near its
capacity reorders its evictions when the steps get faster). DESIGN.md ("Reading the headline") says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ablations.cells import Cell
from ablations.experiment import label
from opts.registry import OPTIMIZATIONS


@dataclass(frozen=True)
class Artefact:
    """Adding `player` (mode `mode`, which only removes work) to coalition `without` lowers the metric."""

    player: str
    mode: str
    without: str
    with_: str
    value_without: float
    value_with: float
    target: float | None
    bracket_without: list[dict[str, Any]]
    bracket_with: list[dict[str, Any]]
    crossed: list[dict[str, Any]]
    fell: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        """One line: the cells, the drop, the brackets, the concurrencies that crossed the target."""
        text = (f"{self.player} ({self.mode}) only removes work, yet {self.without} -> {self.with_} "
                f"drops {self.value_without:.4g} -> {self.value_with:.4g}")
        if self.target is None:
            return text + " (no points recorded)"
        text += f"; bracket of {self.target:g}: {_bracket(self.bracket_without)} -> {_bracket(self.bracket_with)}"
        if self.crossed:
            text += "; crossed the target: " + ", ".join(
                f"c={p['concurrency']} ({p['interactivity_without']:.3g} -> {p['interactivity_with']:.3g})"
                for p in self.crossed)
        if self.fell:
            text += "; the same bracket, its points fell: " + ", ".join(
                f"c={p['concurrency']} {p['throughput_without']:.4g} -> {p['throughput_with']:.4g} tok/s/GPU"
                + (f" (hit rate {p['hit_rate_without']:.3f} -> {p['hit_rate_with']:.3f})" if "hit_rate_with" in p
                   else "") for p in self.fell)
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"player": self.player, "mode": self.mode, "without": self.without, "with": self.with_,
                "value_without": self.value_without, "value_with": self.value_with, "target": self.target,
                "bracket_without": self.bracket_without, "bracket_with": self.bracket_with,
                "crossed": self.crossed, "fell": self.fell, "line": self.line()}


def _bracket(points: list[dict[str, Any]]) -> str:
    return "/".join(f"c={p['concurrency']}" for p in points) or "none"


def _target(cell: Cell) -> float | None:
    slo = (cell.result.get("cell") or {}).get("slo") or {}
    return slo.get("target_interactivity")


def bracket(points: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    """The two points by concurrency around `target`: the last above it and the first below (one if only one
    side exists)."""
    ordered = sorted(points, key=lambda p: p["concurrency"])
    above = [p for p in ordered if p["interactivity"] >= target]
    below = [p for p in ordered if p["interactivity"] < target]
    return ([above[-1]] if above else []) + ([below[0]] if below else [])


def _crossed(a: list[dict[str, Any]], b: list[dict[str, Any]], target: float) -> list[dict[str, Any]]:
    at = {p["concurrency"]: p for p in b}
    out = []
    for p in sorted(a, key=lambda p: p["concurrency"]):
        q = at.get(p["concurrency"])
        if q is not None and (p["interactivity"] >= target) != (q["interactivity"] >= target):
            out.append({"concurrency": p["concurrency"], "interactivity_without": p["interactivity"],
                        "interactivity_with": q["interactivity"]})
    return out


def _hit_rates(cell: Cell) -> dict[int, float]:
    """Each recorded point's prefix hit rate, by concurrency (the simulator records it per point)."""
    details = (cell.result.get("cell") or {}).get("point_details") or []
    return {p["concurrency"]: p["metrics"]["prefix_hit_rate"] for p in details
            if "prefix_hit_rate" in (p.get("metrics") or {})}


def _fell(without: Cell, with_: Cell, bracket_without: list[dict[str, Any]],
          bracket_with: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the bracket kept its concurrencies, those of its points whose throughput fell."""
    if [p["concurrency"] for p in bracket_without] != [p["concurrency"] for p in bracket_with]:
        return []
    rates_without, rates_with = _hit_rates(without), _hit_rates(with_)
    out = []
    for a, b in zip(bracket_without, bracket_with, strict=True):
        if b["throughput_per_gpu"] < a["throughput_per_gpu"]:
            c = a["concurrency"]
            entry = {"concurrency": c, "throughput_without": a["throughput_per_gpu"],
                     "throughput_with": b["throughput_per_gpu"]}
            if c in rates_without and c in rates_with:
                entry.update(hit_rate_without=rates_without[c], hit_rate_with=rates_with[c])
            out.append(entry)
    return out


def work_removing_modes(cells: list[Cell], players: tuple[str, ...]) -> dict[str, str]:
    """Each player whose on mode in these cells only removes work: name -> that mode."""
    out = {}
    for p in players:
        modes = {c.result.get("toggles", {}).get(p, {}).get("mode") for c in cells if p in c.ablation.get("on", [])}
        modes.discard(None)
        if len(modes) == 1 and (mode := modes.pop()) in OPTIMIZATIONS[p].removes_work:
            out[p] = mode
    return out


def artefacts(cells: list[Cell], players: tuple[str, ...], metric: str) -> list[Artefact]:
    """Every pair of finished cells (repeat 0) where adding a work-removing player lowers `metric`, in player
    order, the largest drop first."""
    by_coalition = {frozenset(c.ablation.get("on", [])): c for c in cells
                    if c.ok and c.ablation.get("repeat", 0) == 0 and metric in c.result.get("metrics", {})}
    found = []
    for player, mode in work_removing_modes([c for c in cells if c.ok], players).items():
        drops = []
        for coalition, without in by_coalition.items():
            if player in coalition or (with_ := by_coalition.get(coalition | {player})) is None:
                continue
            v0, v1 = float(without.result["metrics"][metric]), float(with_.result["metrics"][metric])
            if v1 >= v0:
                continue
            target = _target(without)
            p0, p1 = without.result.get("points") or [], with_.result.get("points") or []
            if target is None or not (p0 and p1):
                drops.append(Artefact(player, mode, label(coalition, players), label(coalition | {player}, players),
                                      v0, v1, None, [], [], []))
                continue
            b0, b1 = bracket(p0, target), bracket(p1, target)
            drops.append(Artefact(player, mode, label(coalition, players), label(coalition | {player}, players),
                                  v0, v1, target, b0, b1, _crossed(p0, p1, target), _fell(without, with_, b0, b1)))
        found += sorted(drops, key=lambda a: a.value_with - a.value_without)
    return found
