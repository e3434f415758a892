"""What the notebooks show: sweep rows, headline frontiers, and every microbenchmark JSON form as off/on rows."""

from __future__ import annotations

import json

import pytest
from toy_sweep import PLAYERS, write_sweep

from ablations.attribution.sweep import attribute, collect
from ablations.inspection import (
    alone_vs_together,
    frontiers,
    headline,
    load_microbench,
    load_sweep,
    microbench_rows,
    sweep_rows,
    text_table,
)

CPU = {"cpu_model": "EPYC", "cpu_isa": "avx512"}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_sweep_rows_frontiers_and_alone_vs_together(tmp_path):
    cells = load_sweep(write_sweep(tmp_path, repeats=2))
    rows = sweep_rows(cells)
    assert len(rows) == 8 and {r["toggles"] for r in rows} >= {"kda_overlap=off fusion=off", "kda_overlap=on fusion=on"}
    assert all(r["total_throughput"] > 0 and len(r["config_hash"]) == 12 for r in rows)
    sweep = collect(cells)
    assert [name for name, _ in headline(sweep)] == ["all_off", "kda_overlap", "fusion", "kda_overlap+fusion"]
    curves = frontiers(cells, sweep)
    assert all(len(c["points"]) == 2 for c in curves.values())
    # the toy service: every toggle makes requests faster, so both throughput and interactivity rise
    assert curves["kda_overlap+fusion"]["frontier"][-1].interactivity > curves["all_off"]["frontier"][-1].interactivity
    out = attribute(sweep, bootstrap_num=50)
    table = alone_vs_together(out)
    assert [r["toggle"] for r in table] == list(PLAYERS)
    for r in table:   # the pair adds 5% on top: each toggle buys more last in than alone
        assert r["last_in"] > r["alone"] > 0
    assert "kda_overlap" in text_table(table)


def test_a_cell_without_serving_metrics_has_no_frontier(tmp_path):
    cells = load_sweep(write_sweep(tmp_path, repeats=1))
    cells[0].result["metrics"].pop("interactivity_p90")
    with pytest.raises(ValueError, match=r"result.json: no interactivity_p90 among its metrics"):
        frontiers(cells, collect(cells))


def test_every_benchmark_json_form_becomes_off_on_rows_with_its_machine(tmp_path):
    generic = write(tmp_path, "mla.json", {"optimization": "aiter_mla", "device": "cpu: EPYC", "cases": [
        {"case": "ctx4k", "off_s": 2.0, "on_s": 1.0, "device": "cpu: EPYC"}]})
    cache = write(tmp_path, "cache.json", {"optimization": "cache_retention", "cpu_model": "EPYC", "cases": [
        {"case": "agentx", "fractions": [0.1, 0.5], "hit_rates": {"off": [0.2, 0.0], "on": [0.3, 0.1]}}]})
    draft = write(tmp_path, "draft.json", {"optimization": "draft_length", **CPU, "cases": [
        {"case": "cpu", "rows": [{"profile": "flat", "bucket": [1, 4], "fixed_goodput": 50.0,
                                  "chosen_goodput": 60.0}]}]})
    moe = write(tmp_path, "moe.json", {"optimization": "moe_dedup", **CPU, "cases": [
        {"case": "tail_T64", "num_tokens": 64, "modes": {"off": {"median_s": 0.3}, "on": {"median_s": 0.2}}}]})
    pytest_bench = write(tmp_path, "pb.json", {"machine_info": {}, "benchmarks": [
        {"name": "test_fusion[n1]", "fullname": "tests/benchmarks/test_fusion.py::test_fusion[n1]",
         "extra_info": {"case": "n1", "off_median_s": 3.0, "on_median_s": 1.5, "device": "cpu: EPYC"}}]})
    rows = {r["optimization"]: r for r in load_microbench(str(tmp_path))}
    assert len(load_microbench(str(tmp_path))) == 5   # cache_retention's 0.0 off hit rate has no ratio: left out
    assert (rows["aiter_mla"]["gain"], rows["aiter_mla"]["machine"]) == (2.0, "cpu: EPYC")
    assert rows["cache_retention"]["gain"] == pytest.approx(1.5) and rows["cache_retention"]["quantity"] == "hit rate"
    assert rows["draft_length"]["gain"] == pytest.approx(1.2) and rows["draft_length"]["machine"] == "EPYC (avx512)"
    assert rows["moe_dedup"]["gain"] == pytest.approx(1.5) and rows["moe_dedup"]["case"] == "tail_T64"
    assert (rows["fusion"]["gain"], rows["fusion"]["source"]) == (2.0, str(pytest_bench))
    assert {generic, cache, draft, moe} <= {tmp_path / r["source"].rsplit("/", 1)[-1] for r in rows.values()}


@pytest.mark.parametrize(("data", "message"), [
    ("{", r"bad.json: not a benchmark JSON"),
    ({"rows": []}, r"bad.json: neither pytest-benchmark JSON"),
    ({"benchmarks": [{"name": "t", "extra_info": {}}]}, r"bad.json: t: no off/on timing in extra_info"),
    ({"optimization": "x", "cases": [{"case": "c"}]}, r"bad.json: case 'c' of x: no off/on numbers"),
])
def test_bad_benchmark_json_is_named(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(ValueError, match=message):
        microbench_rows(path)


def test_a_path_without_benchmarks_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"empty: no benchmark JSON there"):
        load_microbench(str(tmp_path / "empty"))
