"""Joint draws of the assumed figures: the Latin hypercube covers every range one stratum per draw, collapsed
ranges give the plain run's values (and so the plain run's cell, byte for byte), and the intervals' summary:
5-95%, P(> 0), rank kept, "not resolved" where the interval spans 0."""

from __future__ import annotations

import json

import pytest

from ablations.attribution.draws import (
    apply_draw,
    first_order,
    indices_table,
    latin_hypercube,
    quantile,
    summarize,
    table,
)
from ablations.backends.sim.cell import run_sim_cell
from ablations.config import compose_app
from ablations.workload import load_workload


def mi355x():
    return compose_app(["backend=sim", "model=kimi_k3", "hardware=mi355x_x8", "workload=agentx_small",
                        "backend.concurrency=[1,2]"])


def test_every_range_is_covered_one_stratum_per_draw():
    ranges = {"launch_us": [2.0, 15.0], "efficiency.gemm": [0.56, 0.67], "ccl_us": [12.0, 30.0]}
    draws = latin_hypercube(ranges, 16, seed=3)
    assert len(draws) == 16 and all(set(d) == set(ranges) for d in draws)
    for key, (low, high) in ranges.items():
        strata = sorted(int((d[key] - low) / (high - low) * 16) for d in draws)
        assert strata == list(range(16)), key
    assert latin_hypercube(ranges, 16, seed=3) == draws
    assert latin_hypercube(dict(reversed(list(ranges.items()))), 16, seed=3) == draws
    assert latin_hypercube(ranges, 16, seed=4) != draws
    # the pairing across figures is shuffled, not the same stratum for every figure
    assert any(int((d["launch_us"] - 2) / 13 * 16) != int((d["ccl_us"] - 12) / 18 * 16) for d in draws)


def test_bad_ranges_and_counts_are_named():
    with pytest.raises(ValueError, match=r"ranges\.ccl_us: invalid value \[30\.0, 12\.0\]"):
        latin_hypercube({"ccl_us": [30.0, 12.0]}, 4)
    with pytest.raises(ValueError, match=r"draws: invalid value 0"):
        latin_hypercube({"ccl_us": [1.0, 2.0]}, 0)


def test_collapsed_ranges_reproduce_the_plain_cell_byte_for_byte():
    app = mi355x()
    hw = app.hardware
    collapsed = {key: [hw.value(key)] * 2 for key in hw.ranges}
    draws = latin_hypercube(collapsed, 3)
    assert all(apply_draw(hw, d) == hw for d in draws)
    trace = load_workload(app.workload)
    plain = run_sim_cell(app.backend, app.model.name, hw, app.toggles(), trace)
    drawn = run_sim_cell(app.backend, app.model.name, apply_draw(hw, draws[1]), app.toggles(), trace)

    def strip(cell):
        return json.dumps({**cell, "point_details": [{k: v for k, v in p.items() if k != "wall_s"}
                                                     for p in cell["point_details"]]}, sort_keys=True)
    assert strip(drawn) == strip(plain)
    # and a real draw moves the cell
    moved = latin_hypercube(hw.ranges, 3, seed=1)[0]
    assert apply_draw(hw, moved) != hw


def test_a_draw_keeps_efficiencies_at_most_one():
    hw = mi355x().hardware
    assert apply_draw(hw, {"efficiency.gemm": 1.3}).efficiency["gemm"] == 1.0
    assert apply_draw(hw, {"launch_us": 7.5}).launch_us == 7.5


def test_the_summary_gives_intervals_p_positive_and_rank_stability():
    point = {"a": 10.0, "b": 5.0, "c": -1.0}
    draws = [{"a": 10.0 + i, "b": 5.0 - i, "c": -1.0 + 0.2 * i} for i in range(20)]   # b overtakes c, c crosses 0
    out = summarize(point, draws)
    assert out["a"].resolved and out["a"].p_positive == 1.0 and out["a"].rank_kept == 1.0
    assert (out["a"].low, out["a"].high) == (quantile(range(10, 30), 0.05), quantile(range(10, 30), 0.95))
    assert not out["c"].resolved and out["c"].p_positive == pytest.approx(14 / 20)
    assert out["b"].rank_kept == pytest.approx(6 / 20)      # b second while 5 - i >= -1 + 0.2 i (a tie by name)
    assert out["b"].values == tuple(5.0 - i for i in range(20))
    text = table(out, 20)
    assert "over 20 joint draws" in text
    assert "over 20 of 32 joint draws" in table(out, 20, of=32) and "over 20 joint" in table(out, 20, of=20)
    assert [line.endswith("not resolved by the model") for line in text.splitlines()[2:]] == [False, True, True]


def test_the_quantile_is_linear_between_order_statistics():
    assert quantile([0.0, 10.0], 0.05) == pytest.approx(0.5)
    assert quantile([3.0], 0.95) == 3.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_the_first_order_index_names_the_figure_that_moves_each_toggle():
    ranges = {"a_us": [1.0, 2.0], "b_eff": [0.3, 0.6], "c_us": [10.0, 30.0]}
    figures = latin_hypercube(ranges, 32, seed=3)
    # x moves with b alone; y with a mostly and c a little; z does not move
    values = [{"x": 100 * f["b_eff"], "y": 50 * f["a_us"] + 0.5 * f["c_us"], "z": 7.0} for f in figures]
    out = first_order(values, figures)
    assert list(out["x"]) == ["b_eff", "a_us", "c_us"] and out["x"]["b_eff"] == pytest.approx(1.0)
    assert out["x"]["a_us"] < 0.2 and out["x"]["c_us"] < 0.2
    assert next(iter(out["y"])) == "a_us" and out["y"]["a_us"] > 0.8 > out["y"]["c_us"] > 0.0
    assert set(out["z"].values()) == {0.0}
    assert "x" in indices_table(out, 32) and "b_eff 1.00" in indices_table(out, 32)
    # an unresolved toggle names the figure that moves it most
    point = {"x": 45.0, "w": 0.0}
    draws = [{"x": v["x"], "w": f["c_us"] - 20.0} for v, f in zip(values, figures, strict=True)]
    text = table(summarize(point, draws), 32, first_order(draws, figures))
    assert "not resolved by the model (most moved by c_us: rho^2 1.00)" in text
    with pytest.raises(ValueError, match="3 draws of values, 2 of figures"):
        first_order(values[:3], figures[:2])
