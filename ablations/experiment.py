"""Ablation experiments: which toggle vectors a design runs, and which one a run is.

A design names its players (toggles) and the mode each counts as on and off; its cells are coalitions (the
toggles on). A multirun over `ablation.cell` (conf/design/*.yaml fill it with `${k3_cells:}`) runs one cell
per coalition; the app sets the players' modes from the cell and leaves every other toggle as composed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ablations.attribution.shapley import Coalition, factorial, one_at_a_time, permutation_cells, permutations
from opts.registry import OPTIMIZATIONS

DESIGNS = ("single", "factorial", "one_at_a_time", "shapley_sampled")
ALL_OFF = "all_off"
SEP = "+"


@dataclass
class AblationConfig:
    """The experiment a run belongs to (node `ablation`; conf/experiment/ presets set it).

    `design`: single (one run, the opts as composed), factorial, one_at_a_time or shapley_sampled.
    `toggles`: the players; empty: every toggle wired on the run's backend. `on` / `off`: the mode a player
    takes when on / off (default "on" / "off"). `num_permutations`, `seed`: shapley_sampled's random orders.
    `repeats`: how many times each cell runs (conf/experiment/repeat.yaml sweeps `repeat` over them).
    `cell`: the coalition this run is, "all_off" or toggles joined by "+" (the sweep sets it); empty in a
    single run. `metric`: what the attribution explains. `draws`, `draw`, `draw_seed`: the joint draws of the
    hardware's assumed figures (`ablations/attribution/draws.py`, conf/experiment/draws.yaml): this cell runs draw
    `draw` of `draws` (-1: the point values); `drawn`, the figures the draw set (filled by `apply_cell`). `ranges`: the
    assumed figures outside the hardware a draw sets too ({config path: [low, high]}, a list entry by its
    index: `opts.draft_length.alphas.0`), each with its reason in `range_reasons`.
    """

    design: str = "single"
    toggles: list[str] = field(default_factory=list)
    on: dict[str, str] = field(default_factory=dict)
    off: dict[str, str] = field(default_factory=dict)
    num_permutations: int = 6
    seed: int = 0
    repeats: int = 1
    repeat: int = 0
    cell: str = ""
    metric: str = "total_throughput"
    draws: int = 0
    draw: int = -1
    draw_seed: int = 0
    drawn: dict[str, float] = field(default_factory=dict)
    ranges: dict[str, list[float]] = field(default_factory=dict)
    range_reasons: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.design not in DESIGNS:
            raise ValueError(f"ablation.design: unknown value {self.design!r}; valid: {', '.join(DESIGNS)}")
        unknown = [t for t in [*self.toggles, *self.on, *self.off] if t not in OPTIMIZATIONS]
        if unknown:
            raise ValueError(f"ablation.toggles: unknown toggle(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(OPTIMIZATIONS)}")
        if len(set(self.toggles)) != len(self.toggles):
            raise ValueError(f"ablation.toggles: {self.toggles} names a toggle twice")
        for name, value in (("num_permutations", self.num_permutations), ("repeats", self.repeats)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ablation.{name}: invalid value {value!r}; valid: an integer >= 1")
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 0:
            raise ValueError(f"ablation.draws: invalid value {self.draws!r}; valid: an integer >= 0")
        for key, bounds in self.ranges.items():
            if not (isinstance(bounds, list | tuple) and len(bounds) == 2 and all(
                    isinstance(b, int | float) and not isinstance(b, bool) for b in bounds) and bounds[0] <= bounds[1]):
                raise ValueError(f"ablation.ranges.{key}: invalid value {bounds!r}; valid: [low, high], low <= high")
            if not key.startswith(("backend.", "opts.", "workload.")):
                raise ValueError(f"ablation.ranges.{key}: not a backend., opts. or workload. figure (the hardware's "
                                 "ranges are hardware.ranges)")
            if not self.range_reasons.get(key):
                raise ValueError(f"ablation.ranges.{key}: no reason; valid: ablation.range_reasons.{key} says why "
                                 "the figure is assumed and where the range comes from")
        if not -1 <= self.draw < self.draws:
            raise ValueError(f"ablation.draw: {self.draw} is not in -1..{self.draws - 1} (ablation.draws; -1 the "
                             "point values)")
        if not 0 <= self.repeat < self.repeats:
            raise ValueError(f"ablation.repeat: {self.repeat} is not in 0..{self.repeats - 1} (ablation.repeats)")
        if self.design == "single" and self.cell:
            raise ValueError(f"ablation.cell: {self.cell!r} set in a single run; valid: a design "
                             f"({', '.join(DESIGNS[1:])}) or no cell")

    def on_mode(self, name: str) -> str:
        return self.on.get(name, "on")

    def off_mode(self, name: str) -> str:
        return self.off.get(name, "off")


def label(coalition: Iterable[str], players: Iterable[str]) -> str:
    """A coalition's cell name: "all_off", or its toggles in player order joined by "+"."""
    on = [p for p in players if p in set(coalition)]
    return SEP.join(on) if on else ALL_OFF


def parse_label(text: str, players: tuple[str, ...]) -> Coalition:
    """The coalition a cell name stands for; a toggle that is not a player is a ValueError naming the players."""
    if text == ALL_OFF:
        return frozenset()
    names = text.split(SEP)
    bad = [n for n in names if n not in players]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"ablation.cell: {text!r} names {', '.join(bad) or 'a toggle twice'}; valid: "
                         f"{ALL_OFF!r} or players joined by {SEP!r} ({', '.join(players)})")
    return frozenset(names)


def design_cells(design: str, players: tuple[str, ...], *, num_permutations: int = 6,
                 seed: int = 0) -> list[Coalition]:
    """The coalitions `design` runs over `players`."""
    if not players:
        raise ValueError("ablation.toggles: no toggle to ablate (none given and none wired on this backend)")
    if design == "factorial":
        return factorial(players)
    if design == "one_at_a_time":
        return one_at_a_time(players)
    if design == "shapley_sampled":
        return permutation_cells(permutations(players, num_permutations, seed))
    raise ValueError(f"ablation.design: {design!r} has no cells; valid: {', '.join(DESIGNS[1:])}")


def cell_vector(ablation: AblationConfig, players: tuple[str, ...], opts: dict[str, Any]) -> dict[str, Any]:
    """`opts` (name -> its config fields) with each player's mode set by `ablation.cell`."""
    coalition = parse_label(ablation.cell, players)
    out = {name: dict(fields) for name, fields in opts.items()}
    for name in players:
        out[name]["mode"] = ablation.on_mode(name) if name in coalition else ablation.off_mode(name)
    return out
