"""Attribution math on games with known answers."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from ablations.attribution.shapley import (
    Game,
    MissingCells,
    add_one_in,
    bootstrap,
    factorial,
    interactions,
    interactions_at_ends,
    leave_one_out,
    main_effects,
    one_at_a_time,
    permutation_cells,
    permutations,
    shapley,
    shapley_sampled,
)

PLAYERS = ("a", "b", "c", "d")


def game_of(value, players=PLAYERS, repeats=1) -> Game:
    return Game(players, {c: (value(c),) * repeats for c in factorial(players)})


def test_additive_game_shapley_equals_main_effects_and_every_delta():
    weights = {"a": 3.0, "b": -1.0, "c": 0.5, "d": 0.0}
    game = game_of(lambda s: 10 + sum(weights[p] for p in s))
    assert shapley(game) == pytest.approx(weights)
    assert main_effects(game) == pytest.approx(weights)
    assert leave_one_out(game) == pytest.approx(weights)
    assert add_one_in(game) == pytest.approx(weights)
    assert interactions(game) == pytest.approx(dict.fromkeys(itertools.combinations(PLAYERS, 2), 0.0))


def test_a_pure_pairwise_interaction_is_split_equally():
    game = game_of(lambda s: 6.0 if {"a", "c"} <= s else 0.0)
    assert shapley(game) == pytest.approx({"a": 3.0, "b": 0.0, "c": 3.0, "d": 0.0})
    assert interactions(game)["a", "c"] == pytest.approx(6.0)
    assert add_one_in(game) == pytest.approx(dict.fromkeys(PLAYERS, 0.0))
    assert leave_one_out(game) == pytest.approx({"a": 6.0, "b": 0.0, "c": 6.0, "d": 0.0})


def test_a_symmetric_game_gives_everyone_the_same_share():
    game = game_of(lambda s: len(s) ** 2)
    assert shapley(game) == pytest.approx(dict.fromkeys(PLAYERS, 16 / 4))


def test_a_null_player_gets_zero_and_the_values_sum_to_all_on_minus_all_off():
    rng = random.Random(7)
    table = {c: rng.uniform(-5, 5) for c in factorial(("a", "b", "c"))}
    game = game_of(lambda s: table[frozenset(s - {"d"})])     # d changes nothing
    phi = shapley(game)
    assert phi["d"] == pytest.approx(0.0, abs=1e-12)
    assert sum(phi.values()) == pytest.approx(game.v(PLAYERS) - game.v(()))


def test_the_sampled_estimate_lands_within_its_stated_error_of_the_exact_one():
    rng = random.Random(3)
    table = {c: rng.uniform(0, 100) for c in factorial(PLAYERS)}
    game = game_of(lambda s: table[frozenset(s)])
    exact = shapley(game)
    estimate, error = shapley_sampled(game, permutations(PLAYERS, 200, seed=11))
    for p in PLAYERS:
        assert error[p] > 0
        assert abs(estimate[p] - exact[p]) <= 3 * error[p], (p, estimate[p], exact[p], error[p])
    assert sum(estimate.values()) == pytest.approx(game.v(PLAYERS) - game.v(()))


def test_the_sampled_estimate_needs_only_the_cells_along_its_orders():
    orders = permutations(PLAYERS, 3, seed=0)
    cells = permutation_cells(orders)
    assert len(cells) <= 1 + 3 * 4 and frozenset() in cells and frozenset(PLAYERS) in cells
    game = Game(PLAYERS, {c: (float(len(c)),) for c in cells})
    estimate, _ = shapley_sampled(game, orders)
    assert estimate == pytest.approx(dict.fromkeys(PLAYERS, 1.0))
    with pytest.raises(MissingCells, match="exact Shapley values"):
        shapley(game)
    assert permutations(PLAYERS, 3, seed=0) == orders, "seeded: the same orders again"


def test_one_at_a_time_cells_and_the_interactions_they_allow():
    cells = one_at_a_time(("a", "b"))
    assert cells == [frozenset(), {"a"}, {"b"}, {"a", "b"}]
    assert len(one_at_a_time(PLAYERS)) == 1 + 4 + 4 + 1
    game = Game(("a", "b"), {c: (5.0 if c == {"a", "b"} else 1.0 * len(c),) for c in cells})
    assert interactions_at_ends(game) == {("a", "b"): pytest.approx(3.0)}
    three = ("a", "b", "c")
    additive = Game(three, {c: (float(len(c)),) for c in one_at_a_time(three)})
    assert interactions_at_ends(additive) == dict.fromkeys(itertools.combinations(three, 2), 0.0)
    assert interactions_at_ends(Game(PLAYERS, {c: (1.0,) for c in one_at_a_time(PLAYERS)})) == {}, \
        "four toggles: neither end has a pair's four cells"


def test_missing_cells_are_named():
    game = Game(("a", "b"), {frozenset(): (1.0,), frozenset({"a"}): (2.0,), frozenset({"a", "b"}): (4.0,)})
    with pytest.raises(MissingCells, match=r"1 cell\(s\) missing: b$"):
        shapley(game)
    with pytest.raises(MissingCells, match="add-one-in deltas: 1 cell"):
        add_one_in(game)
    with pytest.raises(ValueError, match="unknown toggle"):
        Game(("a",), {frozenset({"z"}): (1.0,)})
    with pytest.raises(ValueError, match="finite"):
        Game(("a",), {frozenset(): (math.nan,)})


def test_bootstrap_intervals_hold_the_point_and_vanish_without_noise():
    rng = random.Random(5)
    weights = {"a": 2.0, "b": 1.0}
    noisy = Game(("a", "b"), {c: tuple(sum(weights[p] for p in c) + rng.gauss(0, 0.3) for _ in range(8))
                              for c in factorial(("a", "b"))})
    intervals = bootstrap(noisy, shapley, num=300, seed=1)
    point = shapley(noisy)
    for p in ("a", "b"):
        low, high = intervals[p]
        assert low <= point[p] <= high and high - low > 0.05
    exact = game_of(lambda s: float(len(s)), players=("a", "b"), repeats=3)
    assert bootstrap(exact, shapley, num=50) == {p: (pytest.approx(1.0), pytest.approx(1.0)) for p in ("a", "b")}
