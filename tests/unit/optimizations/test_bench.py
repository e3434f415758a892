"""The microbenchmark harness: the one interleaved timing loop, the off/on check, devices, paths, the machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from opts import bench
from opts.base import BenchCase, BenchPair
from opts.machine import ISA_FLAGS, cpu_isa, cpu_model


def test_compare_alternates_off_and_on():
    calls = []
    timing = bench.compare(BenchPair(off=lambda: calls.append("off"), on=lambda: calls.append("on")), "cpu",
                           budget_s=0.0, min_rounds=5)
    assert len(timing.off_s) == len(timing.on_s) == 5
    assert calls[:2] == ["off", "on"]                                 # one warm-up call each
    assert calls[2:8] == ["off", "on", "on", "off", "off", "on"]      # then the order flips every round
    assert timing.ratio > 0


def test_timing_ratio_is_the_median_of_per_round_ratios():
    timing = bench.Timing(off_s=[2.0, 4.0, 9.0], on_s=[1.0, 1.0, 1.0])
    assert timing.ratio == 4.0 and timing.off_median_s == 4.0 and timing.on_median_s == 1.0


@dataclass
class _Out:
    o: torch.Tensor
    state: torch.Tensor
    note: str = "not a tensor"


def _case(off, on, atol=1e-6, rtol=0.0) -> BenchCase:
    return BenchCase("toy", lambda: BenchPair(off=off, on=on), bytes=1, flops=1, atol=atol, rtol=rtol)


def test_checked_pair_passes_equal_outputs_and_reports_the_difference():
    x = torch.arange(6.0)
    case = _case(lambda: (x, _Out(x, x)), lambda: (x + 1e-7, _Out(x, x)))
    _, diff = bench.checked_pair(case, "cpu")
    assert 0 < diff < 1e-6


@pytest.mark.parametrize("where", ["tensor", "dataclass field"])
def test_checked_pair_fails_when_on_differs_from_off(where):
    x = torch.arange(6.0)
    wrong = x.clone()
    wrong[3] += 1e-3
    on = (lambda: (wrong, _Out(x, x))) if where == "tensor" else (lambda: (x, _Out(x, wrong)))
    with pytest.raises(AssertionError, match="toy: on != off in"):
        bench.checked_pair(_case(lambda: (x, _Out(x, x)), on), "cpu")


def test_checked_pair_fails_on_nan_and_on_different_outputs():
    x = torch.ones(3)
    with pytest.raises(AssertionError):
        bench.checked_pair(_case(lambda: x, lambda: torch.full((3,), float("nan"))), "cpu")
    with pytest.raises(AssertionError, match="both must return the same, non-empty outputs"):
        bench.checked_pair(_case(lambda: (x, x), lambda: x), "cpu")
    with pytest.raises(AssertionError, match="non-empty"):
        bench.checked_pair(_case(lambda: None, lambda: None), "cpu")


def test_a_case_must_state_its_tolerance():
    with pytest.raises(ValueError, match="atol None missing or invalid"):
        BenchCase("toy", lambda: None, 1, 1, atol=None, rtol=0.0)
    with pytest.raises(ValueError, match=r"rtol -1\.0 missing or invalid"):
        BenchCase("toy", lambda: None, 1, 1, atol=0.0)


def test_check_device_names_the_valid_choices():
    assert bench.check_device("cpu") == "cpu"
    with pytest.raises(ValueError, match=r"--device: invalid value 'tpu'; valid choices here: cpu"):
        bench.check_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA or ROCm device is visible; valid choices here: cpu"):
            bench.check_device("cuda")


def test_check_writable(tmp_path: Path):
    assert bench.check_writable(tmp_path / "r.json") == tmp_path / "r.json"
    assert not (tmp_path / "r.json").exists()                      # checking leaves nothing behind
    with pytest.raises(ValueError, match="is a directory"):
        bench.check_writable(tmp_path)
    with pytest.raises(ValueError, match=r"folder .*missing.* does not exist"):
        bench.check_writable(tmp_path / "missing" / "r.json")


def test_machine_names_the_cpu_and_its_isa():
    assert cpu_model()
    isa = cpu_isa()
    assert "; aten " in isa
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for flag in ISA_FLAGS:
        if f" {flag} " in flags:
            assert flag in isa.split(";")[0].split("+")
    info = bench.machine_info("cpu")
    assert info["isa"] == isa and info["cpu_model"] == cpu_model() and isa in info["device"]
