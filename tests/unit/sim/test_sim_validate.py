"""`python -m ablations.sim validate` on a small case: DeepSeek-R1 points read off simulated sweeps, ratios, the
frontier's interpolation, orderings, the table, the plot, and the published data file's rows."""

from __future__ import annotations

import math

import pytest
import yaml

from ablations.backends.sim.validate import (
    POINTS_FILE,
    Point,
    Row,
    at_interactivity,
    compare,
    load_points,
    orderings,
    plot,
    simulate,
    simulated,
    summary,
    sweeps,
    table,
)
from ablations.sim import main

BASE = {"isl": 1024, "osl": 256, "source": "https://example.org/a", "date": "2026-01-01", "framework": "vLLM",
        "quote": "a row"}
SMALL = {"curve": (2,), "requests_per_slot": 2, "min_requests": 4, "workers": 1}


def point(**values) -> Point:
    return Point(**{**BASE, **values})


@pytest.fixture(scope="module")
def small():
    points = [point(id="amd", node="mi355x_x8", metric="output_per_gpu", value=100.0, concurrency=4),
              point(id="nv", node="b200_x8", metric="output_per_gpu", value=120.0, concurrency=4),
              point(id="ratio", node="mi355x_x8", vs="b200_x8", metric="ratio", value=1.2, concurrency=4,
                    ratio_of="output_per_gpu"),
              point(id="slo", node="b200_x8", metric="total_per_gpu", value=300.0, interactivity=150.0)]
    runs = sweeps(points, **SMALL)
    return points, runs, compare(points, runs)


def test_a_point_is_the_simulated_figure_at_its_concurrency(small):
    points, runs, rows = small
    direct = simulate(points[0].config(), 4, requests_per_slot=2, min_requests=4)
    assert rows[0].simulated == direct["output_per_gpu"] > 0
    assert (rows[0].interactivity, rows[0].ttft_s) == (direct["interactivity"], direct["ttft_p50_s"])
    assert sorted(r["concurrency"] for r in runs[points[0].config()]) == [2, 4]
    assert rows[0].error == pytest.approx(rows[0].simulated / 100.0 - 1)


def test_a_ratio_divides_the_two_nodes_at_one_configuration(small):
    _, _, rows = small
    assert rows[2].simulated == pytest.approx(rows[0].simulated / rows[1].simulated)
    assert rows[2].ordering == (rows[2].simulated > 1)


def test_an_interactivity_point_interpolates_the_frontier_and_never_extrapolates(small):
    points, runs, rows = small
    curve = runs[points[3].config()]
    lo, hi = sorted(curve, key=lambda r: r["interactivity"])
    mid = (lo["interactivity"] + hi["interactivity"]) / 2
    assert at_interactivity(curve, "total_per_gpu", mid) == pytest.approx((lo["total_per_gpu"] + hi["total_per_gpu"])
                                                                          / 2)
    assert math.isnan(at_interactivity(curve, "total_per_gpu", hi["interactivity"] * 2))
    inside = point(id="in", node="b200_x8", metric="total_per_gpu", value=300.0, interactivity=mid)
    assert simulated(inside, runs) == at_interactivity(curve, "total_per_gpu", mid) > 0
    assert math.isnan(rows[3].simulated) == math.isnan(at_interactivity(curve, "total_per_gpu", 150.0))


def test_orderings_count_ratios_and_pairs_of_absolute_points(small):
    _, _, rows = small
    found = {what: ok for what, *_, ok in orderings(rows)}
    assert set(found) == {"ratio", "amd / nv"}
    amd, nv = rows[0].simulated, rows[1].simulated
    assert found["amd / nv"] == ((100 / 120 > 1) == (amd / nv > 1))
    s = summary(rows)
    assert s["orderings"] == 2 and s["held_out"] == 4 and s["calibrated_from"] == 0


def test_summary_errors_are_absolute_and_the_table_names_the_worst():
    p = point(id="x", node="mi355x_x8", metric="output_per_gpu", value=100.0, concurrency=1)
    q = point(id="y", node="mi355x_x8", metric="output_per_gpu", value=200.0, concurrency=2)
    rows = [Row(p, 80.0), Row(q, 260.0)]
    s = summary(rows)
    assert (s["median_abs_error"], s["worst_abs_error"], s["worst"], s["within_goal"]) == (
        pytest.approx(0.25), pytest.approx(0.3), "y", 1)
    text = table(rows)
    assert "| x | mi355x_x8 | 1k/256 | off | c=1 | output_per_gpu | 100 | 80 | 0.80 | -20.0% |  |  |" in text
    assert "worst 30.0% (y)" in text


def test_the_plot_is_written(small, tmp_path):
    _, runs, rows = small
    assert plot(rows, runs, tmp_path / "f.png").stat().st_size > 10_000


@pytest.mark.parametrize(("change", "message"), [
    ({"metric": "speed"}, "point 'p': metric: invalid value 'speed'"),
    ({"source": " "}, "point 'p': source: empty"),
    ({"interactivity": 20.0}, "point 'p': give exactly one of concurrency and interactivity"),
    ({"metric": "ratio"}, "point 'p': a ratio needs vs"),
    ({"precision": "fp4"}, "point 'p': precision: 'fp4' is not modelled"),
    ({"mtp": 1}, "point 'p': mtp_alphas: 0 rates for mtp 1 drafts"),
])
def test_bad_points_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        point(**{"id": "p", "node": "mi355x_x8", "metric": "output_per_gpu", "value": 1.0, "concurrency": 4,
                 **change})


def test_a_bad_row_names_the_file_and_row(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump([{**BASE, "id": "a", "node": "mi355x_x8", "metric": "output_per_gpu",
                                     "value": 1.0, "concurrency": 4, "speed": 2}]))
    with pytest.raises(ValueError, match=r"p.yaml: row 1: unknown field\(s\) speed"):
        load_points(path)


def test_the_published_points_cover_an_amd_and_an_nvidia_node_each_with_its_source():
    points = load_points(POINTS_FILE)
    assert len(points) >= 8
    nodes = {p.node for p in points} | {p.vs for p in points if p.vs}
    assert "mi355x_x8" in nodes and nodes & {"b200_x8", "b300_x8", "h200_x8"}
    assert all(p.source.startswith("https://") for p in points)


def test_the_command_prints_the_table_on_a_small_case(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump([{**BASE, "id": "a", "node": "b200_x8", "metric": "output_per_gpu",
                                     "value": 50.0, "concurrency": 2}]))
    assert main(["validate", "--points", str(path), "--plot", str(tmp_path / "v.png"), "--curve",
                 "--requests-per-slot", "2", "--workers", "1", "--json", str(tmp_path / "v.json")]) == 0
    out = capsys.readouterr().out
    assert "| a | b200_x8 | 1k/256 | off | c=2 | output_per_gpu | 50 |" in out
    assert (tmp_path / "v.png").exists() and (tmp_path / "v.json").exists()
