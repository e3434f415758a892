"""Attribution of a metric's change between all-off and all-on to the toggles (the math; README.md, section
"Attribution", states the formulas).

A game: players (toggle names) and, per coalition (the set of toggles on), the metric's values over repeats.
v(S) is the mean over repeats. Everything here is exact arithmetic over the cells it is given; a cell a
quantity needs and the game lacks is a MissingCells error naming the coalitions.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

Coalition = frozenset[str]


class MissingCells(ValueError):
    """Cells a computation needs that the game does not have."""

    def __init__(self, what: str, missing: Iterable[Coalition], players: tuple[str, ...]) -> None:
        self.missing = sorted(missing, key=lambda c: (len(c), sorted(c)))
        names = "; ".join(label(c, players) for c in self.missing[:8])
        more = f" and {len(self.missing) - 8} more" if len(self.missing) > 8 else ""
        super().__init__(f"{what}: {len(self.missing)} cell(s) missing: {names}{more}")


def label(coalition: Iterable[str], players: tuple[str, ...]) -> str:
    """A coalition as text: the toggles on, in player order, or "all off"."""
    on = [p for p in players if p in coalition]
    return "+".join(on) if on else "all off"


@dataclass(frozen=True)
class Game:
    """`players` and the metric's values per coalition (each a non-empty list: one value per repeat)."""

    players: tuple[str, ...]
    values: Mapping[Coalition, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.players)) != len(self.players) or not self.players:
            raise ValueError(f"players: {self.players!r}; valid: distinct names, at least one")
        known = set(self.players)
        values = {}
        for coalition, repeats in self.values.items():
            coalition = frozenset(coalition)
            if not coalition <= known:
                raise ValueError(f"coalition {sorted(coalition)}: unknown toggle(s) {sorted(coalition - known)}; "
                                 f"players: {', '.join(self.players)}")
            repeats = tuple(float(x) for x in repeats)
            if not repeats or not all(math.isfinite(x) for x in repeats):
                raise ValueError(f"cell {label(coalition, self.players)}: values {repeats!r}; valid: finite numbers, "
                                 "at least one")
            values[coalition] = repeats
        object.__setattr__(self, "values", values)

    @property
    def n(self) -> int:
        return len(self.players)

    @property
    def all_on(self) -> Coalition:
        return frozenset(self.players)

    def v(self, coalition: Iterable[str]) -> float:
        """The mean metric of the cell with exactly `coalition` on."""
        key = frozenset(coalition)
        if key not in self.values:
            raise MissingCells("value", [key], self.players)
        return statistics.fmean(self.values[key])

    def has(self, coalition: Iterable[str]) -> bool:
        return frozenset(coalition) in self.values

    def require(self, coalitions: Iterable[Coalition], what: str) -> None:
        """A MissingCells error naming those of `coalitions` the game lacks."""
        missing = {frozenset(c) for c in coalitions if frozenset(c) not in self.values}
        if missing:
            raise MissingCells(what, missing, self.players)

    def resampled(self, rng: random.Random) -> Game:
        """The game with each cell's repeats drawn again with replacement (a bootstrap sample)."""
        return Game(self.players, {c: tuple(rng.choices(r, k=len(r))) for c, r in self.values.items()})


# designs: which coalitions an experiment runs


def factorial(players: Iterable[str]) -> list[Coalition]:
    """Every coalition (2^n), by size then player order."""
    players = tuple(players)
    return [frozenset(c) for k in range(len(players) + 1) for c in itertools.combinations(players, k)]


def one_at_a_time(players: Iterable[str]) -> list[Coalition]:
    """All off, each alone, all but one, all on (distinct, in that order)."""
    players = tuple(players)
    everyone = frozenset(players)
    cells = [frozenset(), *(frozenset([p]) for p in players), *(everyone - {p} for p in players), everyone]
    return list(dict.fromkeys(cells))


def permutations(players: Iterable[str], num: int, seed: int) -> list[tuple[str, ...]]:
    """`num` random orders of the players, drawn with `seed` (the same on every machine)."""
    players = tuple(players)
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"num_permutations: invalid value {num!r}; valid: an integer >= 1")
    rng = random.Random(seed)
    return [tuple(rng.sample(players, len(players))) for _ in range(num)]


def permutation_cells(orders: Iterable[tuple[str, ...]]) -> list[Coalition]:
    """The coalitions along the orders (every prefix of each), distinct, all off first."""
    cells: dict[Coalition, None] = {frozenset(): None}
    for order in orders:
        for k in range(1, len(order) + 1):
            cells[frozenset(order[:k])] = None
    return list(cells)


# values


def shapley(game: Game) -> dict[str, float]:
    """Exact Shapley values: phi_i = sum over S not holding i of |S|!(n-|S|-1)!/n! (v(S+i) - v(S)); needs the
    full factorial. They sum to v(all on) - v(all off)."""
    game.require(factorial(game.players), "exact Shapley values (the full factorial)")
    n = game.n
    weight = [math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) for k in range(n)]
    phi = {}
    for p in game.players:
        others = [q for q in game.players if q != p]
        phi[p] = sum(weight[k] * (game.v(set(s) | {p}) - game.v(s))
                     for k in range(n) for s in itertools.combinations(others, k))
    return phi


def shapley_sampled(game: Game, orders: Iterable[tuple[str, ...]]) -> tuple[dict[str, float], dict[str, float]]:
    """(estimate, standard error) of the Shapley values from the players' marginal contributions along
    `orders` (each a permutation of all players); the error is the sample standard deviation over orders
    / sqrt(orders), 0 with one order. Every order's estimate sums to v(all on) - v(all off) exactly."""
    orders = [tuple(o) for o in orders]
    for order in orders:
        if sorted(order) != sorted(game.players):
            raise ValueError(f"order {order!r} is not a permutation of the players {game.players!r}")
    if not orders:
        raise ValueError("shapley_sampled: no orders")
    game.require(permutation_cells(orders), "sampled Shapley values")
    contributions: dict[str, list[float]] = {p: [] for p in game.players}
    for order in orders:
        before: set[str] = set()
        for p in order:
            contributions[p].append(game.v(before | {p}) - game.v(before))
            before.add(p)
    mean = {p: statistics.fmean(c) for p, c in contributions.items()}
    error = {p: statistics.stdev(c) / math.sqrt(len(c)) if len(c) > 1 else 0.0 for p, c in contributions.items()}
    return mean, error


def leave_one_out(game: Game) -> dict[str, float]:
    """v(all on) - v(all on without i): what removing i from everything else loses."""
    everyone = game.all_on
    game.require([everyone, *(everyone - {p} for p in game.players)], "leave-one-out deltas")
    return {p: game.v(everyone) - game.v(everyone - {p}) for p in game.players}


def add_one_in(game: Game) -> dict[str, float]:
    """v({i}) - v(all off): what i buys alone."""
    game.require([frozenset(), *(frozenset([p]) for p in game.players)], "add-one-in deltas")
    return {p: game.v({p}) - game.v(()) for p in game.players}


def main_effects(game: Game) -> dict[str, float]:
    """Factorial main effects: the mean of v(S+i) - v(S) over every S not holding i (needs the factorial)."""
    game.require(factorial(game.players), "main effects (the full factorial)")
    out = {}
    for p in game.players:
        others = [q for q in game.players if q != p]
        deltas = [game.v(set(s) | {p}) - game.v(s) for k in range(len(others) + 1)
                  for s in itertools.combinations(others, k)]
        out[p] = statistics.fmean(deltas)
    return out


def interactions(game: Game) -> dict[tuple[str, str], float]:
    """Pairwise interactions: the mean over S holding neither i nor j of v(S+ij) - v(S+i) - v(S+j) + v(S)
    (needs the factorial); 0 for an additive pair."""
    game.require(factorial(game.players), "pairwise interactions (the full factorial)")
    out = {}
    for a, b in itertools.combinations(game.players, 2):
        others = [q for q in game.players if q not in (a, b)]
        terms = [game.v(set(s) | {a, b}) - game.v(set(s) | {a}) - game.v(set(s) | {b}) + game.v(s)
                 for k in range(len(others) + 1) for s in itertools.combinations(others, k)]
        out[a, b] = statistics.fmean(terms)
    return out


def interactions_at_ends(game: Game) -> dict[tuple[str, str], float]:
    """Pairwise interactions from the cells a one-at-a-time design has: at all off,
    v(ij) - v(i) - v(j) + v(none), where those four cells exist, else at all on,
    v(all) - v(all-i) - v(all-j) + v(all-ij); pairs neither end covers are left out."""
    out = {}
    everyone = game.all_on
    for a, b in itertools.combinations(game.players, 2):
        low = [frozenset({a, b}), frozenset({a}), frozenset({b}), frozenset()]
        high = [everyone, everyone - {a}, everyone - {b}, everyone - {a, b}]
        for cells in (low, high):
            if all(game.has(c) for c in cells):
                out[a, b] = game.v(cells[0]) - game.v(cells[1]) - game.v(cells[2]) + game.v(cells[3])
                break
    return out


def bootstrap(game: Game, statistic: Callable[[Game], Mapping], *, num: int = 1000, seed: int = 0,
              level: float = 0.9) -> dict:
    """Percentile intervals (key -> (low, high)) of `statistic` over `num` bootstrap games, each cell's
    repeats resampled with replacement; a cell with one repeat contributes no spread."""
    if not 0 < level < 1:
        raise ValueError(f"level: invalid value {level!r}; valid: 0 < level < 1")
    rng = random.Random(seed)
    draws: dict = {}
    for _ in range(num):
        for key, value in statistic(game.resampled(rng)).items():
            draws.setdefault(key, []).append(value)
    tail = (1 - level) / 2
    return {key: (quantile(v, tail), quantile(v, 1 - tail)) for key, v in draws.items()}


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values`, linear between order statistics."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
