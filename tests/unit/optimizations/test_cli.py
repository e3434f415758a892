"""`python -m opts list|bench`: the documented output, in-process and once through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opts import registry
from opts.__main__ import main

ROW_FIELDS = {"case", "off_s", "on_s", "ratio", "bytes", "flops", "device", "off_GBps", "on_GBps", "copy_GBps",
              "off_frac_of_copy_bw", "on_frac_of_copy_bw"}


def test_list_json_through_python_m_opts() -> None:
    done = subprocess.run([sys.executable, "-m", "opts", "list", "--json"], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[3])
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
    path = tmp_path / "out" / "aiter_mla.json"
    assert main(["bench", "aiter_mla", "--quick", "--case", "ctx4k_b1", "--budget", "0.05", "--threads", "1",
                 "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "copy bandwidth" in printed and "ctx4k_b1" in printed
    result = json.loads(path.read_text())
    assert result["optimization"] == "aiter_mla" and result["quick"] is True and result["copy_GBps"] > 0
    assert result["threads"] == 1
    [row] = result["cases"]
    assert set(row) >= ROW_FIELDS
    assert row["case"] == "ctx4k_b1" and row["off_s"] > 0 and row["on_s"] > 0
    assert row["ratio"] == pytest.approx(row["off_s"] / row["on_s"])
    assert row["bytes"] > 4096 * 576 * 2 and row["flops"] > 2 * 12 * 4096 * 1088
    assert row["on_GBps"] == pytest.approx(row["bytes"] / row["on_s"] / 1e9)


def test_bench_errors_name_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no_such_opt"]) == 2
    assert "valid choices" in capsys.readouterr().err
    assert main(["bench", "aiter_mla", "--quick", "--case", "ctx999k"]) == 2
    assert "no benchmark case matches 'ctx999k'; cases: ctx4k_b1, ctx4k_b16, ctx32k_b1" in capsys.readouterr().err
    assert main(["bench", "aiter_mla", "--threads", "0"]) == 2
    assert "--threads: invalid value 0" in capsys.readouterr().err
