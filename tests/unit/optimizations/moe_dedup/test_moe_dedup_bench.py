"""moe_dedup's bench: its cases, the crossover, `run_bench` end to end on small shapes (real ranks), the
registry record."""

from __future__ import annotations

import json

import pytest

from opts.moe_dedup import OPTIMIZATION
from opts.moe_dedup.bench.runner import crossover, run_bench
from opts.moe_dedup.cases import DistCase, bench_cases
from opts.moe_dedup.shape import K3_MOE, K3_MOE_BENCH, TEST_SHAPE


def test_case_sets() -> None:
    quick = bench_cases(True, "cpu")
    assert [c.name for c in quick] == ["tail_T1", "tail_T64", "tail_T1024"]
    assert all(c.shape == K3_MOE and c.world_size == 2 and c.backend == "gloo" for c in quick)
    full = bench_cases(False, "cpu")
    assert [c.name for c in full] == [f"{s}_T{t}" for s in ("tail", "layer") for t in (1, 64, 1024, 8192)]
    assert {c.shape for c in full if c.scope == "layer"} == {K3_MOE_BENCH}
    assert OPTIMIZATION.bench_cases is bench_cases and OPTIMIZATION.run_bench is run_bench


def test_bad_cases_are_named() -> None:
    with pytest.raises(ValueError, match=r"DistCase.scope: invalid value 'mlp'; valid choices: tail, layer"):
        DistCase("x", "mlp", TEST_SHAPE, 4, 2)
    with pytest.raises(ValueError, match=r"DistCase.rounds: invalid value 0"):
        DistCase("x", "tail", TEST_SHAPE, 4, 0)
    with pytest.raises(ValueError, match=r"DistCase.modes: invalid value \('on', 'off'\); valid: off first"):
        DistCase("x", "tail", TEST_SHAPE, 4, 2, modes=("on", "off"))
    with pytest.raises(ValueError, match=r"world_size: invalid value 3"):
        DistCase("x", "tail", TEST_SHAPE, 4, 2, world_size=3)


def _row(scope: str, tokens: int, ratio: float) -> dict:
    return {"scope": scope, "num_tokens": tokens, "on_over_off": ratio}


def test_crossover() -> None:
    rows = [_row("tail", 1, 1.2), _row("tail", 64, 0.9), _row("tail", 1024, 0.5), _row("layer", 1, 0.8),
            _row("layer", 64, 1.01), _row("layer", 1024, 0.7), _row("layer", 8192, 0.6)]
    found = crossover(rows)
    assert found["tail"] == {"on_not_faster_at": [1], "on_faster_from": 64, "tokens": [1, 64, 1024]}
    assert found["layer"]["on_not_faster_at"] == [64] and found["layer"]["on_faster_from"] == 1024
    assert crossover([_row("tail", 1, 0.9), _row("tail", 64, 1.1)])["tail"]["on_faster_from"] is None


@pytest.mark.spawns
def test_run_bench_on_small_shapes() -> None:
    cases = [DistCase("tail_small", "tail", TEST_SHAPE, 5, 2), DistCase("layer_small", "layer", TEST_SHAPE, 7, 3)]
    lines: list[str] = []
    result = run_bench(cases, quick=True, progress=lines.append)
    json.dumps(result)
    assert [r["case"] for r in result["cases"]] == ["tail_small", "layer_small"]
    for row in result["cases"]:
        assert set(row["modes"]) == {"off", "on", "sp"}
        for mode, timing in row["modes"].items():
            assert len(timing["seconds"]) == row["rounds"] and timing["median_s"] > 0
            assert timing["counts"]["mode"] == mode and timing["counts"]["elem_bytes"] == 4
        assert row["on_over_off"] == row["modes"]["on"]["median_s"] / row["modes"]["off"]["median_s"]
        assert row["max_abs_diff"]["on"] <= row["check_rtol"] * row["out_scale"]
        assert row["max_abs_diff"]["sp"] <= row["check_rtol"] * row["out_scale"]
    assert set(result["crossover"]) == {"tail", "layer"}
    assert any("crossover (tail)" in line for line in lines) and any("on/off" in line for line in lines)
    with pytest.raises(ValueError, match=r"--out: moe_dedup writes no files"):
        run_bench(cases, quick=True, out_dir="somewhere")
