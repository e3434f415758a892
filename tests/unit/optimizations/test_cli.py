"""`python -m opts list|bench`: the documented output, in-process and once through the real entry point."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import procs
import pytest
import torch

from opts import registry
from opts.__main__ import main
from opts.machine import cpu_isa, cpu_model

ROW_FIELDS = {"case", "off_s", "on_s", "ratio", "bytes", "flops", "device", "off_GBps", "on_GBps", "copy_GBps",
              "off_frac_of_copy_bw", "on_frac_of_copy_bw"}


@pytest.mark.spawns
def test_list_json_through_python_m_opts() -> None:
    done = procs.run([sys.executable, "-m", "opts", "list", "--json"], timeout_s=120,
                     cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == registry.names()
    for row in rows:
        assert row["description"] and {"off", "on"} <= set(row["modes"])


def test_list_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == registry.names()


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_bench_quick_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_threads: None) -> None:
    path = tmp_path / "kda_overlap.json"
    assert main(["bench", "kda_overlap", "--quick", "--case", "quick_verify_only", "--budget", "0.05",
                 "--threads", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "copy bandwidth" in printed and "quick_verify_only_32x4" in printed
    assert f"{cpu_model()} ({cpu_isa()}), 1 threads" in printed
    result = json.loads(path.read_text())
    assert result["optimization"] == "kda_overlap" and result["quick"] is True and result["copy_GBps"] > 0
    assert result["threads"] == 1 and result["isa"] == cpu_isa() and result["cpu_model"] == cpu_model()
    [row] = result["cases"]
    assert set(row) >= ROW_FIELDS
    assert row["case"] == "quick_verify_only_32x4" and row["off_s"] > 0 and row["on_s"] > 0
    assert row["ratio"] == pytest.approx(row["off_s"] / row["on_s"])
    assert row["max_abs_diff"] <= row["atol"] and row["rounds"] >= 3
    assert row["on_GBps"] == pytest.approx(row["bytes"] / row["on_s"] / 1e9)


def test_bench_errors_name_the_choices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no_such_opt"]) == 2
    assert "valid choices" in capsys.readouterr().err
    assert main(["bench", "kda_overlap", "--quick", "--case", "ctx999k"]) == 2
    assert ("no benchmark case matches 'ctx999k'; cases: quick_mixed_2x256_prefill+32x4_verify, "
            "quick_verify_only_32x4, quick_prefill_only_2x256") in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["bench", "kda_overlap", "--threads", "0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("error: argument --threads: '0' is not an integer >= 1 "
                                       "(see python -m opts bench --help)\n")
    assert main(["bench", "kda_overlap", "--budget", "-1"]) == 2
    assert capsys.readouterr().err == "error: --budget: invalid value -1.0; must be > 0 seconds\n"
    assert main(["bench", "kda_overlap", "--device", "tpu"]) == 2
    assert "--device: invalid value 'tpu'; valid choices here: cpu" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_bench_on_a_missing_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kda_overlap", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA or ROCm device is visible; valid choices here: cpu" in err


def test_bench_checks_the_json_path_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("opts.bench.run", lambda *a, **k: pytest.fail("ran before checking --json"))
    assert main(["bench", "kda_overlap", "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert "--json: folder" in capsys.readouterr().err
    assert main(["bench", "kda_overlap", "--json", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_bench_exits_1_when_on_differs_from_off(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import opts.kda_overlap.cases as cases

    step_off = cases.step_off

    def step_on_wrong(batch, out):
        step_off(batch, out=out).o.add_(1.0)
        return out

    monkeypatch.setattr(cases, "step_on", step_on_wrong)
    assert main(["bench", "kda_overlap", "--quick", "--case", "quick_verify_only", "--budget", "0.01"]) == 1
    assert "quick_verify_only_32x4: on != off in o" in capsys.readouterr().err
