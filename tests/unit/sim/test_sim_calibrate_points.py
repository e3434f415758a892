"""`python -m ablations.sim calibrate`: a figure fitted from the points marked `calibrates` recovers a planted
value, refuses what it cannot reach, writes its profiles' line, and the profiles hold what the published points
give; validate reports the calibration points apart from the held-out ones."""

from __future__ import annotations

import pytest
import yaml

from ablations.backends.sim import calibrate_points
from ablations.backends.sim.calibrate_points import Calibration, calibrate, errors_at, fit, groups, write
from ablations.backends.sim.validate import POINTS_FILE, Point, Row, load_points, summary, table
from ablations.config import compose_app
from ablations.sim import main

BASE = {"isl": 1024, "osl": 64, "source": "https://example.org/a", "date": "2026-01-01", "framework": "SGLang",
        "quote": "a row", "metric": "total_per_gpu", "concurrency": 1}
SMALL = {"requests_per_slot": 2, "min_requests": 3}


def point(**values) -> Point:
    return Point(**{"id": "p", "node": "b200_x8", "value": 1.0, **BASE, **values})


def planted(floor: float, **values) -> Point:
    """A point whose published figure is the simulator's own with the floor at `floor`."""
    p = point(calibrates="kernel_floor_us", **values)
    (error,) = errors_at([p], "kernel_floor_us", floor, **SMALL)
    return point(calibrates="kernel_floor_us", **{**values, "value": p.value * (1 + error)})


def test_the_fit_recovers_a_planted_floor():
    value, errors = fit([planted(4.0)], "kernel_floor_us", **SMALL)
    assert value == pytest.approx(4.0, abs=0.05)
    assert abs(errors[0]) < 0.01


def test_a_floor_out_of_reach_is_named():
    with pytest.raises(ValueError, match=r"at 0, its lowest, the simulator is already slower than p"):
        fit([point(value=1e6, calibrates="kernel_floor_us")], "kernel_floor_us", **SMALL)
    with pytest.raises(ValueError, match=r"at 30, its highest, the simulator is still faster than p"):
        fit([point(value=1e-3, calibrates="kernel_floor_us")], "kernel_floor_us", **SMALL)


def test_points_group_by_figure_and_platform_and_bad_marks_are_named():
    mark = {"calibrates": "kernel_floor_us"}
    a, b, c = point(id="a", **mark), point(id="b", node="h200_x8", **mark), point(id="c", node="mi355x_x8", **mark)
    found = groups([a, b, c, point(id="held")])
    assert {k: [p.id for p in v] for k, v in found.items()} == {("kernel_floor_us", "cuda"): ["a", "b"],
                                                                ("kernel_floor_us", "rocm"): ["c"]}
    with pytest.raises(ValueError, match=r"point 'p': calibrates: 'launch_us' is not a figure a calibration sets"):
        groups([point(calibrates="launch_us")])
    with pytest.raises(ValueError, match=r"a calibration point is a throughput at a concurrency"):
        groups([point(metric="ratio", vs="h200_x8", calibrates="kernel_floor_us")])


def test_write_rewrites_the_figure_in_each_profile_of_the_platform(tmp_path):
    (tmp_path / "a.yaml").write_text("platform: cuda\nkernel_floor_us: 0  # the floor\nlaunch_us: 4\n")
    (tmp_path / "b.yaml").write_text("platform: rocm\nkernel_floor_us: 1\n")
    c = Calibration("kernel_floor_us", "cuda", 6.5, ("p",), (0.0,), ("a",))
    assert write(c, tmp_path) == [tmp_path / "a.yaml"]
    assert (tmp_path / "a.yaml").read_text() == "platform: cuda\nkernel_floor_us: 6.5  # the floor\nlaunch_us: 4\n"
    assert (tmp_path / "b.yaml").read_text().endswith("kernel_floor_us: 1\n")
    (tmp_path / "a.yaml").write_text("platform: cuda\n")
    with pytest.raises(ValueError, match=r"a.yaml: no line kernel_floor_us: to write the calibrated 6.5 into"):
        write(c, tmp_path)


def test_the_profiles_hold_what_the_published_calibration_points_give():
    """Rerun `python -m ablations.sim calibrate --write` when the cost model or these points change."""
    found = calibrate(load_points(POINTS_FILE))
    assert {(c.figure, c.platform) for c in found} == {("kernel_floor_us", "cuda"), ("kernel_floor_us", "rocm")}
    for c in found:
        assert all(abs(e) < 0.01 for e in c.errors)
        for node in c.nodes:
            hw = compose_app([f"hardware={node}"]).hardware
            assert hw.kernel_floor_us == pytest.approx(c.value), node
            assert "python -m ablations.sim calibrate" in hw.sources["kernel_floor_us"]
            assert all(p in hw.sources["kernel_floor_us"] for p in c.points), node
    assert compose_app(["hardware=cpu"]).hardware.kernel_floor_us == 0


def test_validate_reports_the_calibration_points_apart():
    held, cal = point(id="h", value=100.0), point(id="c", value=100.0, calibrates="kernel_floor_us")
    rows = [Row(held, 150.0), Row(cal, 100.5)]
    s = summary(rows)
    assert (s["held_out"], s["calibrated_from"], s["worst"]) == (1, 1, "h")
    assert s["median_abs_error"] == pytest.approx(0.5) and s["calibration_errors"] == {"c": pytest.approx(0.005)}
    text = table(rows)
    assert "| c (calibrates kernel_floor_us) |" in text
    assert "1 of 1 held-out points compared (1 more set a figure" in text and "c +0.5%" in text


def test_the_command_prints_the_fit_and_refuses_points_with_no_mark(tmp_path, capsys, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump([{**BASE, "id": "a", "node": "b200_x8", "value": 50.0}]))
    assert main(["calibrate", "--points", str(path)]) == 2
    assert "no point is marked calibrates" in capsys.readouterr().err
    monkeypatch.setattr(calibrate_points, "fit", lambda points, figure, progress, **sim: (5.0, [0.001]))
    path.write_text(yaml.safe_dump([{**BASE, "id": "a", "node": "b200_x8", "value": 50.0,
                                     "calibrates": "kernel_floor_us"}]))
    assert main(["calibrate", "--points", str(path)]) == 0
    assert "| kernel_floor_us | cuda | 5 | a | +0.1% | b200_x8, b300_x8, h200_x8 |" in capsys.readouterr().out
