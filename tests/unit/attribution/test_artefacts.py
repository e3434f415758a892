"""The frontier-artefact flag: a planted cost-only toggle whose cells read lower than without it is flagged,
naming the cells and the concurrency that crossed the target; a toggle that may add work, or a positive one,
is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.attribution import sweep as attribute
from ablations.attribution.shapley import factorial
from ablations.cells import write_result
from ablations.experiment import label
from opts.registry import OPTIMIZATIONS

PLAYERS = ("kda_overlap", "fusion")
TARGET = 50.0


def points(coalition) -> list[dict]:
    """Three concurrencies; fusion on raises every point a little, yet c=24 falls below the target in the
    cell with kda_overlap (the planted artefact: its bracket moves down a concurrency)."""
    lift = 0.3 if "fusion" in coalition else 0.0
    out = [{"concurrency": 20, "interactivity": 60.0 + lift, "throughput_per_gpu": 4000.0 + 10 * lift},
           {"concurrency": 24, "interactivity": 50.5 + lift, "throughput_per_gpu": 5000.0 + 10 * lift},
           {"concurrency": 28, "interactivity": 40.0 + lift, "throughput_per_gpu": 5500.0 + 10 * lift}]
    if coalition == {"kda_overlap", "fusion"}:
        out[1]["interactivity"] = 49.0
    return out


def headline(pts: list[dict]) -> float:
    above = max((p for p in pts if p["interactivity"] >= TARGET), key=lambda p: p["concurrency"])
    below = min((p for p in pts if p["interactivity"] < TARGET), key=lambda p: p["concurrency"])
    w = (TARGET - below["interactivity"]) / (above["interactivity"] - below["interactivity"])
    return below["throughput_per_gpu"] + w * (above["throughput_per_gpu"] - below["throughput_per_gpu"])


def write_sweep(root: Path, on_mode: dict[str, str] | None = None) -> None:
    on_mode = on_mode or {"kda_overlap": "on", "fusion": "on"}
    for coalition in factorial(PLAYERS):
        pts = points(set(coalition))
        name = label(coalition, PLAYERS)
        write_result(root / f"{name}.r0" / "result.json", {
            "schema": 1, "status": "ok", "workload": "agentx", "model": "kimi_k3", "backend": "sim",
            "setting_hash": "s", "toggles": {p: {"mode": on_mode[p] if p in coalition else "off"} for p in PLAYERS},
            "metrics": {"tput_per_gpu_at_slo": headline(pts)}, "points": pts,
            "cell": {"slo": {"target_interactivity": TARGET}},
            "config": {"ablation": {"design": "factorial", "repeats": 1}},
            "ablation": {"design": "factorial", "players": list(PLAYERS), "cell": name, "on": sorted(coalition),
                         "repeat": 0, "metric": "tput_per_gpu_at_slo"}})


def test_the_planted_toggles_are_what_the_registry_says():
    assert "on" in OPTIMIZATIONS["fusion"].removes_work
    assert "on" not in OPTIMIZATIONS["kda_overlap"].removes_work      # packed: the rows' chunked FLOPs are added


def test_a_cost_only_toggle_with_a_negative_value_is_flagged_with_its_cells_and_points(tmp_path, capsys):
    write_sweep(tmp_path)
    assert attribute.main([str(tmp_path)]) == 0
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert out["shapley"]["fusion"] < 0
    assert out["flagged"] == {"fusion": ["shapley", "leave_one_out"]}
    (drop,) = out["artefacts"]
    assert (drop["player"], drop["without"], drop["with"]) == ("fusion", "kda_overlap", "kda_overlap+fusion")
    assert [p["concurrency"] for p in drop["bracket_without"]] == [24, 28]
    assert [p["concurrency"] for p in drop["bracket_with"]] == [20, 24]
    assert drop["crossed"] == [{"concurrency": 24, "interactivity_without": 50.5, "interactivity_with": 49.0}]
    text = capsys.readouterr().out
    assert "frontier artefact: fusion's shapley, leave_one_out < 0 although it only removes work" in text
    assert "kda_overlap -> kda_overlap+fusion" in text and "crossed the target: c=24 (50.5 -> 49)" in text


@pytest.mark.parametrize(("mode", "flagged"), [("on", False), ("streams", True)])
def test_only_a_mode_that_removes_work_is_flagged(tmp_path, mode, flagged):
    # adding kda_overlap to fusion also crosses c=24: a real drop for its packed pass (it may add work), an
    # artefact for its streams (the same passes, overlapped)
    write_sweep(tmp_path, {"kda_overlap": mode, "fusion": "on"})
    out = attribute.attribute(attribute.collect(attribute.find_cells(tmp_path)))
    drops = [a for a in out["artefacts"] if a["player"] == "kda_overlap"]
    assert bool(drops) == flagged and ("kda_overlap" in out["flagged"]) == flagged
    if flagged:
        assert (drops[0]["without"], drops[0]["with"]) == ("fusion", "kda_overlap+fusion")


def test_no_flag_where_the_work_removing_toggle_never_lowers_a_cell(tmp_path):
    write_sweep(tmp_path, {"kda_overlap": "streams", "fusion": "on"})
    cells = sorted(tmp_path.glob("*/result.json"))
    for path in cells:          # undo the plant: c=24 stays above the target with both on
        result = json.loads(path.read_text())
        result["points"] = points(set()) if result["ablation"]["on"] == [] else points({"fusion"} & set(
            result["ablation"]["on"]))
        result["metrics"]["tput_per_gpu_at_slo"] = headline(result["points"])
        write_result(path, result)
    out = attribute.attribute(attribute.collect(attribute.find_cells(tmp_path)))
    assert out["artefacts"] == [] and out["flagged"] == {}
    assert out["shapley"]["fusion"] > 0


def test_a_drop_inside_the_same_bracket_names_the_points_that_fell_and_their_hit_rates(tmp_path):
    """The main job's case: adding fusion keeps the bracket (c=24 / c=28) but the points themselves fall, with
    the prefix hit rate (a cache near its capacity evicting in another order)."""
    write_sweep(tmp_path)
    with_dir = tmp_path / "kda_overlap+fusion.r0" / "result.json"
    without = json.loads((tmp_path / "kda_overlap.r0" / "result.json").read_text())
    result = json.loads(with_dir.read_text())
    pts = [dict(p) for p in without["points"]]
    for p in pts[1:]:
        p["throughput_per_gpu"] -= 400.0
    result["points"] = pts
    result["metrics"]["tput_per_gpu_at_slo"] = headline(pts)
    result["cell"]["point_details"] = [{"concurrency": p["concurrency"], "metrics": {"prefix_hit_rate": r}}
                                       for p, r in zip(pts, (0.97, 0.944, 0.88), strict=True)]
    without["cell"]["point_details"] = [{"concurrency": p["concurrency"], "metrics": {"prefix_hit_rate": r}}
                                        for p, r in zip(pts, (0.97, 0.963, 0.89), strict=True)]
    write_result(with_dir, result)
    write_result(tmp_path / "kda_overlap.r0" / "result.json", without)
    assert attribute.main([str(tmp_path)]) == 0
    drops = json.loads((tmp_path / "attribution.json").read_text())["artefacts"]
    (drop,) = [d for d in drops if d["with"] == "kda_overlap+fusion"]
    assert drop["crossed"] == [] and [p["concurrency"] for p in drop["bracket_with"]] == [24, 28]
    assert drop["fell"] == [
        {"concurrency": 24, "throughput_without": 5000.0, "throughput_with": 4600.0, "hit_rate_without": 0.963,
         "hit_rate_with": 0.944},
        {"concurrency": 28, "throughput_without": 5500.0, "throughput_with": 5100.0, "hit_rate_without": 0.89,
         "hit_rate_with": 0.88}]
    assert "the same bracket, its points fell: c=24 5000 -> 4600 tok/s/GPU (hit rate 0.963 -> 0.944)" in drop["line"]
