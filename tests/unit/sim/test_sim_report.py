"""The simulator's report: which values it moves (those a profile marks assumed), how it moves them, its rows and
table, and `python -m ablations.sim report --json`."""

from __future__ import annotations

import json

import pytest

from ablations import sim
from ablations.backends.sim.report import assumed, compose, report, scaled, table

SMALL = ("workload.num_sessions=2", "backend.concurrency=[1,2,4]")
ROW_KEYS = {"hardware", "opts", "tput_per_gpu_at_slo", "tokens_per_dollar", "frontier", "points", "toggles"}


def test_the_values_moved_are_exactly_those_the_profile_marks_assumed():
    hw = compose("mi355x_x8", "all_off").hardware
    assert assumed(hw) == ["ccl_busbw_gb_s", "ccl_us", "efficiency.attention", "efficiency.elementwise",
                           "efficiency.recurrent", "graph_launch_us", "graph_node_us", "host_overhead_us", "launch_us"]
    assert "bandwidth_tb_s" not in assumed(hw) and "ar_1stage_us" not in assumed(hw)


def test_scaled_moves_one_value_and_keeps_an_efficiency_at_most_one():
    hw = compose("mi355x_x8", "all_off").hardware
    assert scaled(hw, "launch_us", 1.2).launch_us == pytest.approx(6.0)
    assert scaled(hw, "efficiency.moe", 0.8).efficiency == {**hw.efficiency, "moe": pytest.approx(0.496)}
    assert scaled(hw, "efficiency.elementwise", 1.5).efficiency["elementwise"] == 1.0
    assert hw.launch_us == 5.0 and hw.efficiency["moe"] == 0.62
    with pytest.raises(ValueError, match=r"^bogus: not a figure of hardware mi355x_x8"):
        scaled(hw, "bogus", 1.2)


def test_all_on_switches_on_every_modelled_toggle_and_nothing_else():
    cuda = {name: c.mode for name, c in compose("b300_x8", "all_on").toggles().items()}
    assert cuda == {**dict.fromkeys(cuda, "on"), "aiter_mla": "off"}
    rocm = {name: c.mode for name, c in compose("mi355x_x8", "all_on").toggles().items()}
    assert rocm == {**cuda, "aiter_mla": "on"}          # AITER's MLA decode exists on ROCm only


@pytest.mark.slow
def test_a_report_has_a_row_per_node_and_toggle_set_and_the_sensitivity_of_all_off():
    lines = []
    rows = report(("mi355x_x8",), workers=1, overrides=SMALL, progress=lines.append)
    assert [(r["hardware"], r["opts"]) for r in rows] == [("mi355x_x8", "all_off"), ("mi355x_x8", "all_on")]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert len(lines) == 2 + 2 * 9 and lines[0].startswith("sim report: [1/20] mi355x_x8 all_off: ")
    moved = rows[0]["sensitivity"]
    assert [m["value"] for m in moved] == assumed(compose("mi355x_x8", "all_off").hardware)
    assert all(set(m) - {"x0.8_reason", "x1.2_reason"} == {"value", "x0.8", "x1.2"} for m in moved)
    assert all((m[k] is None) == (f"{k}_reason" in m) for m in moved for k in ("x0.8", "x1.2"))
    assert "sensitivity" not in rows[1]
    text = table(rows)
    assert text.splitlines()[2].startswith("| mi355x_x8 | all_off | ")
    assert "| efficiency.moe | " in text and "with each assumed value at -20% and +20%" in text


def test_the_cli_writes_the_rows_as_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert sim.main(["report", "--json", str(out), "--hardware", "b300_x8", "--no-sensitivity", "--workers", "1",
                     *SMALL]) == 0
    rows = json.loads(out.read_text())
    assert [(r["hardware"], r["opts"]) for r in rows] == [("b300_x8", "all_off"), ("b300_x8", "all_on")]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert "| b300_x8 | all_on |" in capsys.readouterr().out
    assert sim.main(["report", "--hardware", "nope", "--no-sensitivity", "--workers", "1"]) == 2
    assert "hardware: unknown option 'nope'" in capsys.readouterr().err
