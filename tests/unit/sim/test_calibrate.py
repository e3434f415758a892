"""`python -m ablations.calibrate`: the efficiency fit, the profile it writes, the packages' CALIBRATION tables, and
one run end to end on this CPU."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest
import yaml

from ablations import calibrate
from ablations.calibrate import Fit, Peaks, Row, calibrated, fit, profile_yaml
from ablations.hardware import KERNEL_CLASSES, OPTIONAL_KERNEL_CLASSES, HardwareConfig
from opts import registry

PEAKS = Peaks(bandwidth=100e9, flops=1e12, launch_s=2e-6, memory_gb=64.0)


def test_a_class_efficiency_is_its_rows_roofline_seconds_over_their_seconds():
    rows = [Row("attention", "aiter_mla off", "a", seconds=2e-3, bytes=100e6, flops=1e6),    # 1 ms of bytes
            Row("attention", "aiter_mla off", "b", seconds=8e-3, bytes=1e6, flops=2e9),      # 2 ms of FLOPs
            Row("gemm", "gemm probe", "c", seconds=1e-3, bytes=1e3, flops=2e9)]              # 2 ms: faster than peak
    fits = fit(rows, PEAKS)
    assert fits["attention"] == Fit(pytest.approx(0.3), pytest.approx(0.3), 2, ("aiter_mla off",))
    assert fits["gemm"].raw == pytest.approx(2.0) and fits["gemm"].efficiency == 1.0
    assert "faster than the copy/GEMM peaks" in fits["gemm"].source("today")


def test_the_calibrated_profile_keeps_the_base_figures_it_does_not_measure_and_loads_back():
    base = HardwareConfig(name="node", platform="rocm", num_devices=8, link_bandwidth_gb_s=500.0,
                          host_overhead_us=900.0, price_per_gpu_hour=2.0, efficiency={"moe": 0.5},
                          sources={"link_bandwidth_gb_s": "vendor", "host_overhead_us": "assumed",
                                   "price_per_gpu_hour": "list price", "efficiency.moe": "assumed"},
                          ranges={"host_overhead_us": [100, 2000], "efficiency.moe": [0.3, 0.7]})
    fits = fit([Row("gemm", "gemm probe", "x", 4e-3, 1e3, 2e9)], PEAKS)
    hw = calibrated(base, PEAKS, fits, "GPU X", "node_cal", "2026-12-02")
    assert (hw.name, hw.platform, hw.num_devices, hw.device) == ("node_cal", "rocm", 8, "GPU X")
    assert (hw.bandwidth_tb_s, hw.peak_bf16_tflops, hw.launch_us, hw.memory, hw.memory_unit) == (0.1, 1.0, 2.0, 64.0,
                                                                                                 "GB")
    assert (hw.link_bandwidth_gb_s, hw.host_overhead_us, hw.price_per_gpu_hour) == (500.0, 900.0, 2.0)
    assert hw.efficiency == {"moe": 0.5, "gemm": 0.5}
    assert hw.sources["efficiency.moe"] == "assumed" and hw.sources["link_bandwidth_gb_s"] == "vendor"
    assert hw.sources["efficiency.gemm"].startswith("measured by python -m ablations.calibrate, 2026-12-02")
    text = profile_yaml(hw, "a header")
    loaded = yaml.safe_load(text)
    assert text.startswith("# a header\n") and loaded.pop("defaults") == ["/hardware_schema@_here_", "_self_"]
    assert HardwareConfig(**loaded) == hw


def test_one_device_needs_no_link_two_do():
    one = HardwareConfig(name="x", num_devices=1)
    assert "link_bandwidth_gb_s" not in one.missing_figures and "memory" in one.missing_figures
    assert "ccl_us" not in one.missing_figures
    assert {"link_bandwidth_gb_s", "ccl_us", "ccl_busbw_gb_s"} <= set(HardwareConfig(name="x", num_devices=2)
                                                                     .missing_figures)


@pytest.mark.parametrize("name", calibrate.calibrated_packages())
def test_each_calibration_table_names_real_cases_sides_and_kernel_classes(name):
    table = calibrate.calibration_of(name)
    cases = [c.name for c in registry.get(name).bench_cases(True, "cpu")]
    for prefix, sides in table.items():
        assert any(c.startswith(prefix) for c in cases), (name, prefix)
        assert set(sides) <= {"off", "on"} and sides
        assert set(sides.values()) <= set(KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES)


def test_the_packages_cover_every_class_but_the_probed_ones():
    covered = {k for n in calibrate.calibrated_packages() for sides in calibrate.calibration_of(n).values()
               for k in sides.values()}
    # attention_blackwell: the MLA decode stock vLLM runs on Blackwell, which no package here benchmarks
    assert covered | {"gemm", "moe", "attention_blackwell"} == set(KERNEL_CLASSES + OPTIONAL_KERNEL_CLASSES)


def test_bad_arguments_are_one_line_errors(capsys, tmp_path):
    assert calibrate.main(["--packages", "cache_retention", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "--packages: 'cache_retention' has no CALIBRATION; valid choices: " in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_a_probe_whose_first_call_exceeds_the_cap_is_timed_once_and_its_larger_sizes_are_skipped(monkeypatch):
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.02)

    assert len(calibrate._times(slow, "cpu", rounds=4, cap_s=0.01)) == 1 and len(calls) == 1
    assert len(calibrate._times(slow, "cpu", rounds=4)) == 4 and len(calls) == 6
    monkeypatch.setattr(calibrate, "PROBE_CAP_S", 0.0)          # every size over the cap: only the first runs
    assert len(calibrate.probe_rows("cpu", rounds=3)) == 2      # one gemm row, one moe row
    timed = []
    real = calibrate._times
    monkeypatch.setattr(calibrate, "_times", lambda fn, d, r, cap=None: timed.append(cap) or real(fn, d, r, cap))
    assert calibrate.gemm_flops("cpu", sizes=(8, 16, 32), rounds=3) > 0 and timed == [0.0]


@pytest.mark.slow
def test_calibrate_writes_a_profile_the_simulator_runs_on(tmp_path):
    out, record = tmp_path / "cpu_cal.yaml", tmp_path / "cal.json"
    assert calibrate.main(["--packages", "fusion", "--budget-s", "0.05", "--name", "cpu_cal", "--out", str(out),
                           "--json", str(record)]) == 0
    loaded = yaml.safe_load(out.read_text())
    loaded.pop("defaults")
    hw = HardwareConfig(**loaded)
    assert hw.name == "cpu_cal" and all(m.startswith("efficiency.") for m in hw.missing_figures)
    for measured in ("gemm", "moe", "elementwise"):
        assert hw.sources[f"efficiency.{measured}"].startswith(calibrate.MEASURED)
        assert 0 < hw.efficiency[measured] <= 1
    assert hw.sources["efficiency.elementwise"].endswith("timed rows of fusion off, fusion on")
    assert {r["path"] for r in yaml.safe_load(record.read_text())["rows"]} >= {"fusion off", "gemm probe"}
    assert asdict(hw)["bandwidth_tb_s"] > 0 and hw.peak_bf16_tflops > 0 and hw.launch_us > 0
