"""The simulator's report: which values it moves (those a profile marks assumed), how it moves them, its rows and
table, and `python -m ablations.sim report --json`."""

from __future__ import annotations

import json

import pytest

from ablations import sim
from ablations.backends.sim.report import assumed, cell_toggles, compose, moves, report, scaled, table, with_value

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
    with pytest.raises(ValueError, match=r"^hardware mi355x_x8: bogus: not a figure"):
        scaled(hw, "bogus", 1.2)


def test_all_on_switches_on_every_modelled_toggle_and_nothing_else():
    cuda = {name: c.mode for name, c in compose("b300_x8", "all_on").toggles().items()}
    assert cuda == {**dict.fromkeys(cuda, "on"), "aiter_mla": "off"}
    rocm = {name: c.mode for name, c in compose("mi355x_x8", "all_on").toggles().items()}
    assert rocm == {**cuda, "aiter_mla": "on"}          # AITER's MLA decode exists on ROCm only


def test_the_sensitivity_moves_each_ranged_figure_to_its_ends_and_each_assumed_one_by_a_fifth():
    hw = compose("mi355x_x8", "all_off").hardware
    got = moves(hw)
    assert ("ar_1stage_us", "low", 6.3) not in got                     # sourced, no range: not moved
    assert [m for m in got if m[0] == "efficiency.moe"] == [("efficiency.moe", "low", 0.36),
                                                          ("efficiency.moe", "high", 0.70)]     # sourced, ranged
    assert [m[1] for m in got if m[0] == "launch_us"] == ["low", "high", "x0.8", "x1.2"]        # assumed, ranged
    assert {m[0] for m in got} == set(hw.ranges) | set(hw.assumed)
    assert with_value(hw, "ccl_busbw_gb_s", 600.0).ccl_busbw_gb_s == hw.link_bandwidth_gb_s     # at most the link


def test_the_stock_cell_sets_each_toggle_to_its_platforms_stock_mode_and_leaves_out_the_rest():
    """Stock vLLM on ROCm: AITER's MLA off, MoE dedup on (ROCmLatentMoERunner), no speculation (k0); fusion has no
    stock mode there (issue 49) and is left out. On CUDA: tiered MoE, fusion on, and aiter_mla left out, so the MLA
    decode runs as the node's stock class (FLASHINFER_MLA's on B300) where aiter_mla off would run TRITON_MLA."""
    rocm = compose("mi355x_x8", "stock")
    assert {n: c.mode for n, c in cell_toggles(rocm, "stock").items()} == {
        "aiter_mla": "off", "cache_retention": "off", "draft_length": "k0", "kda_overlap": "off", "moe_dedup": "on"}
    cuda = compose("b300_x8", "stock")
    assert {n: c.mode for n, c in cell_toggles(cuda, "stock").items()} == {
        "cache_retention": "off", "draft_length": "k0", "fusion": "on", "kda_overlap": "off", "moe_dedup": "tiered"}
    assert len(cell_toggles(cuda, "all_off")) == 6
    from ablations.backends.sim.cell import sim_setup
    stock = sim_setup(cuda.backend, "kimi_k3", cuda.hardware, cell_toggles(cuda, "stock"))
    off = sim_setup(cuda.backend, "kimi_k3", cuda.hardware, cell_toggles(compose("b300_x8", "all_off"), "all_off"))
    assert "mla_decode" not in stock.steps.models[0].classes           # the profile's stock class
    assert off.steps.models[3].classes["mla_decode"] == "attention"     # TRITON_MLA


def test_explain_breaks_each_step_into_parts_that_add_up(capsys):
    from ablations.backends.sim.cell import sim_setup
    from ablations.backends.sim.cost import Seq
    from ablations.backends.sim.explain import explain_step

    app = compose("mi355x_x8", "all_off")
    model = sim_setup(app.backend, "kimi_k3", app.hardware, app.toggles()).steps.models[3]
    for seqs, more in (([Seq(4, 100_000, "verify")] * 4, [Seq(4, 100_000, "verify")]),
                       ([Seq(8192, 100_000, "prefill")], [Seq(82, 108_192, "prefill")]),
                       ([Seq(512, 0, "prefill"), *[Seq(4, 50_000, "verify")] * 3], [Seq(4, 50_000, "verify")])):
        e = explain_step(model, seqs, "a step", [*seqs, *more])
        assert e.parts_s == pytest.approx(e.total_s, rel=1e-12) and e.total_s == pytest.approx(model.time(seqs))
        assert 0 <= e.batch_independent < 1
        assert sum(c["count"] for c in e.collectives) == 93 + 188 + 3 * 2    # the target's, the MTP's, 2 later
    decode = explain_step(model, [Seq(4, 100_000, "verify")] * 4, "decode", [Seq(4, 100_000, "verify")] * 5)
    assert decode.launch == {"mode": "full", "graph_replays": 4, "kernels": decode.launch["kernels"],
                             "seconds": pytest.approx(4 * 20e-6 + decode.launch["kernels"] * 2e-6)}
    assert {c["algorithm"] for c in decode.collectives} == {"ar_1stage"} and decode.batch_independent > 0.2
    assert sim.main(["explain", "--hardware", "b300_x8"]) == 0
    out = capsys.readouterr().out
    assert "b300_x8 (all_off, K = 3), decode: 6 requests x 4 tokens" in out and "all_reduce flashinfer" in out
    assert "launches full" in out and "launches piecewise" not in out      # the 8,192-token chunk: past 1,024
    assert "ms of it the kernel floor)" in out and sum(decode.floor_s.values()) > 0
    assert sim.main(["explain", "--hardware", "nope"]) == 2


@pytest.mark.slow
def test_a_report_has_a_row_per_node_and_toggle_set_and_the_sensitivity_of_all_off():
    lines = []
    rows = report(("mi355x_x8",), workers=1, overrides=SMALL, progress=lines.append)
    assert [(r["hardware"], r["opts"]) for r in rows] == [("mi355x_x8", o) for o in ("stock", "all_off", "all_on")]
    assert all(set(r) >= ROW_KEYS for r in rows)
    hw = compose("mi355x_x8", "all_off").hardware
    assert len(lines) == 3 + len(moves(hw)) and lines[0].startswith(f"sim report: [1/{3 + len(moves(hw))}] ")
    moved = rows[1]["sensitivity"]
    assert [m["value"] for m in moved] == sorted(set(hw.ranges) | set(hw.assumed))
    launch = next(m for m in moved if m["value"] == "launch_us")
    assert set(launch) == {"value", "at", "assumed", "low", "high", "x0.8", "x1.2"} and launch["assumed"]
    assert launch["low"]["set"] == 2 and launch["x1.2"]["set"] == pytest.approx(6.0)
    assert "sensitivity" not in rows[0] and "sensitivity" not in rows[2]
    text = table(rows)
    assert text.splitlines()[2].startswith("| mi355x_x8 | stock | ")
    assert "| efficiency.moe | 0.62 | sourced | 0.36: " in text and "at the ends of its range" in text


def test_the_cli_writes_the_rows_as_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert sim.main(["report", "--json", str(out), "--hardware", "b300_x8", "--no-sensitivity", "--workers", "1",
                     *SMALL]) == 0
    rows = json.loads(out.read_text())
    assert [(r["hardware"], r["opts"]) for r in rows] == [("b300_x8", o) for o in ("stock", "all_off", "all_on")]
    assert all(set(r) >= ROW_KEYS for r in rows)
    assert "| b300_x8 | all_on |" in capsys.readouterr().out
    assert sim.main(["report", "--hardware", "nope", "--no-sensitivity", "--workers", "1"]) == 2
    assert "hardware: unknown option 'nope'" in capsys.readouterr().err
