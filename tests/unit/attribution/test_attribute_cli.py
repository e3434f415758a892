"""`python -m ablations.attribution` over result files: checks that name the bad cell, and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.attribution import sweep as attribute
from ablations.attribution.shapley import factorial, one_at_a_time
from ablations.cells import write_result
from ablations.experiment import label

PLAYERS = ("aiter_mla", "fusion")
WEIGHTS = {"aiter_mla": 2.0, "fusion": 5.0}


def write_cell(root: Path, coalition, *, repeat=0, design="factorial", setting="s1", workload="agentx_small",
               value=None, status="ok", players=PLAYERS, repeats=1) -> Path:
    name = label(coalition, players)
    value = 100 + sum(WEIGHTS.get(p, 1.0) for p in coalition) + (3.0 if {"aiter_mla", "fusion"} <= set(coalition)
                                                                  else 0.0) if value is None else value
    result = {"schema": 1, "status": status, "workload": workload, "model": "k3_tiny", "backend": "vllm",
              "setting_hash": setting, "metrics": {"total_throughput": value + 0.1 * repeat},
              "config": {"ablation": {"design": design, "num_permutations": 6, "seed": 0, "repeats": repeats}},
              "ablation": {"design": design, "players": list(players), "cell": name, "on": sorted(coalition),
                           "repeat": repeat, "metric": "total_throughput"}}
    if status != "ok":
        result["error"] = "RuntimeError: fusion=on never fired"
    return write_result(root / f"{name}.r{repeat}" / "result.json", result)


def test_a_complete_factorial_is_attributed_with_every_key(tmp_path, capsys):
    for c in factorial(PLAYERS):
        write_cell(tmp_path, c)
    assert attribute.main([str(tmp_path), "--json", str(tmp_path / "copy.json")]) == 0
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert {"metric", "all_on", "all_off", "shapley", "interactions"} <= set(out)
    assert out["shapley_method"] == "exact"
    assert out["shapley"] == pytest.approx({"aiter_mla": 3.5, "fusion": 6.5})
    assert sum(out["shapley"].values()) == pytest.approx(out["all_on"] - out["all_off"])
    assert out["interactions"] == {"aiter_mla+fusion": pytest.approx(3.0)}
    assert json.loads((tmp_path / "copy.json").read_text()) == out
    rows = (tmp_path / "attribution.csv").read_text().splitlines()
    assert rows[0].startswith("toggle,shapley") and len(rows) == 3
    assert (tmp_path / "attribution_bars.png").stat().st_size > 0 and (tmp_path / "interactions.png").is_file()
    assert "fusion" in capsys.readouterr().out


def test_a_missing_cell_is_a_one_line_error_naming_it(tmp_path, capsys):
    for c in factorial(PLAYERS)[:-1]:
        write_cell(tmp_path, c)
    assert attribute.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1 of 4 cells missing: aiter_mla+fusion repeat 0" in err
    assert attribute.main([str(tmp_path), "--allow-missing"]) == 0
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert out["missing"] == ["aiter_mla+fusion repeat 0"] and out["shapley"] is None and out["all_on"] is None


def test_a_failed_cell_counts_as_missing_with_its_error(tmp_path, capsys):
    for c in factorial(PLAYERS):
        write_cell(tmp_path, c, status="failed" if c == {"fusion"} else "ok")
    assert attribute.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "missing: fusion repeat 0; failed: fusion (repeat 0" in err and "fusion=on never fired" in err


def test_duplicates_and_foreign_cells_are_named(tmp_path, capsys):
    for c in factorial(PLAYERS):
        write_cell(tmp_path, c)
    dup = write_cell(tmp_path / "again", frozenset({"fusion"}))
    assert attribute.main([str(tmp_path)]) == 2
    assert f"duplicate cell fusion repeat 0: {dup.parent} and {tmp_path}/fusion.r0" in capsys.readouterr().err
    dup.unlink()
    foreign = write_cell(tmp_path / "other", frozenset(), repeat=0, workload="agentx", setting="s2")
    assert attribute.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"foreign cell {foreign.parent}" in err and "workload: 'agentx' vs 'agentx_small'" in err


def test_one_at_a_time_over_four_toggles_uses_the_ends(tmp_path):
    players = ("aiter_mla", "kda_overlap", "fusion", "cache_retention")
    for c in one_at_a_time(players):
        write_cell(tmp_path, c, design="one_at_a_time", players=players, value=100 + 2.0 * len(c))
    assert attribute.main([str(tmp_path)]) == 0
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert out["shapley_method"] == "ends" and out["shapley"] == pytest.approx(dict.fromkeys(players, 2.0))
    assert out["interactions"] == {} and out["main_effects"] is None


def test_repeats_give_bootstrap_intervals(tmp_path):
    for c in factorial(PLAYERS):
        for r in range(3):
            write_cell(tmp_path, c, repeat=r, repeats=3)
    assert attribute.main([str(tmp_path)]) == 0
    out = json.loads((tmp_path / "attribution.json").read_text())
    for p in PLAYERS:
        low, high = out["shapley_interval"][p]
        assert low <= out["shapley"][p] <= high
    assert out["cells"]["all_off"] == pytest.approx([100.0, 100.1, 100.2])


def test_no_cells_is_an_error(tmp_path, capsys):
    assert attribute.main([str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_missing_draws_are_summed_up_per_run_of_draws_alike():
    cells = [label(c, PLAYERS) for c in factorial(PLAYERS)]
    missing = (["fusion repeat 0"] + [f"{c} draw 0" for c in cells[1:]] + [f"{c} draw {d}" for d in (1, 2, 3)
                                                                          for c in cells] + [f"{cells[0]} draw 5"])
    assert attribute.missing_summary(missing, len(cells), named=2) == [
        "fusion repeat 0", "draw 0: 3 of 4 cells (aiter_mla, fusion and 1 more)", "draws 1-3: all 4 cells of each",
        "draw 5: 1 of 4 cells (all_off)"]
    assert attribute.missing_summary([f"{c} draw 7" for c in cells], len(cells)) == ["draw 7: all 4 cells"]
    assert attribute.missing_summary([], 4) == []
