"""The bench's cases and runner, on a tiny stack (the real quick set runs in tests/benchmarks/test_draft_length.py)."""

import json

import pytest
from test_draft_measure import TINY

from opts.draft_length import OPTIMIZATION
from opts.draft_length.bench.runner import check_out_dir, run_bench
from opts.draft_length.cases import FIXED_K, GoodputCase, bench_cases


def test_the_case_sets():
    quick, full = bench_cases(True, "cpu"), bench_cases(False, "cuda")
    assert [c.name for c in quick] == ["quick_cpu_stack"] and [c.name for c in full] == ["cpu_stack"]
    assert FIXED_K in quick[0].ks and full[0].ks == tuple(range(9))
    assert len(quick[0].batch_sizes) * len(quick[0].ks) * quick[0].repeats < 200
    assert OPTIMIZATION.bench_cases is bench_cases and OPTIMIZATION.run_bench is run_bench


def test_run_bench_on_a_tiny_stack_writes_its_result(tmp_path):
    case = GoodputCase("tiny", (1, 2, 4), (0, 1, 2, 3), 2, shape=TINY)
    result = run_bench([case], quick=True, out_dir=tmp_path, progress=None)
    row = result["cases"][0]
    assert result["optimization"] == "draft_length" and row["case"] == "tiny"
    assert {r["profile"] for r in row["rows"]} == {"flat", "decaying"} and len(row["rows"]) == 6
    assert set(row["schedules"]) == {"flat", "decaying"} and len(row["measurements"]["samples"]) == 24
    assert json.loads((tmp_path / "tiny.json").read_text())["case"] == "tiny"
    json.dumps(result)


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match=r"GoodputCase.fixed_k: invalid value 3; valid: one of ks \[0, 1, 2\]"):
        GoodputCase("x", (1, 2), (0, 1, 2), 2)
    with pytest.raises(ValueError, match=r"GoodputCase.repeats: invalid value 1"):
        GoodputCase("x", (1, 2), (0, 3), 1)
    with pytest.raises(ValueError, match=r"GoodputCase.profiles: invalid value \['steep'\]"):
        GoodputCase("x", (1, 2), (0, 3), 2, profiles=("steep",))
    with pytest.raises(ValueError, match=r"GoodputCase.name: invalid value ''"):
        GoodputCase("", (1, 2), (0, 3), 2)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"--out: .* is a file; give a folder"):
        check_out_dir(tmp_path / "file")
    assert check_out_dir(None) is None
