"""A step's time on a modelled node: never below its roofline, the all-reduce by hand, the fit check's message,
and the profiles' values each with a source."""

from __future__ import annotations

import dataclasses

import pytest

from ablations.backends.sim.cost import Cost, Parallel, Seq, SimModel, step_costs
from ablations.backends.sim.timing import allreduce_s, cache_capacity_gb, kernel_class, roofline_s, step_time
from ablations.config import compose_app
from ablations.hardware import KERNEL_CLASSES, HardwareConfig

NODES = ("mi355x_x8", "b300_x8", "h200_x8")


def node(name: str) -> HardwareConfig:
    return compose_app([f"hardware={name}"]).hardware


STEPS = {
    "one decode": [Seq(1, 2000, "decode")],
    "256 decodes": [Seq(1, 30000, "decode")] * 256,
    "a prefill chunk": [Seq(8192, 0, "prefill")],
    "mixed": [Seq(2048, 40000, "prefill")] + [Seq(4, 20000, "verify")] * 64,
}


@pytest.mark.parametrize("hardware", NODES)
@pytest.mark.parametrize("step", list(STEPS))
def test_no_step_beats_its_roofline(hardware, step):
    hw, parallel = node(hardware), Parallel(tp=8)
    costs = step_costs(SimModel(), parallel, STEPS[step])
    bound = roofline_s(costs, hw)
    assert step_time(costs, hw, parallel).total_s >= bound > 0
    ideal = dataclasses.replace(hw, efficiency=dict.fromkeys(KERNEL_CLASSES, 1.0), launch_us=0.0,
                                host_overhead_us=0.0, link_latency_us=0.0)
    assert step_time(costs, ideal, parallel).kernels_s >= bound * (1 - 1e-12)


def test_the_all_reduce_by_hand():
    """1 MB in one ring all-reduce over 8 MI355X: 2·7/8 of it over 537.5 GB/s a direction, 14 hops of 5 µs."""
    hw = node("mi355x_x8")
    assert allreduce_s(1e6, 1, 8, hw) == pytest.approx(1.75e6 / 537.5e9 + 14 * 5e-6)
    assert allreduce_s(1e6, 1, 1, hw) == 0.0


def test_k3_does_not_fit_on_h200_at_tp8_and_says_by_how_much():
    with pytest.raises(ValueError, match=r"kimi_k3 does not fit on h200_x8 at tp=8: its weights take 207.4 GB per "
                                         r"rank, 80.5 GB more than the 126.9 GB usable of 141 GB"):
        cache_capacity_gb(SimModel(), Parallel(tp=8), node("h200_x8"))
    assert cache_capacity_gb(SimModel(), Parallel(tp=8), node("mi355x_x8")) == pytest.approx(288 * 0.9 - 207.4,
                                                                                            abs=0.05)


def test_a_decode_step_is_mostly_weights_and_the_host():
    """64 decodes at 8k tokens on MI355X: weights are most of the bytes, and the step is bandwidth bound: its
    kernels take what their bytes take at each class's efficiency, within the launches and all-reduces."""
    hw, parallel = node("mi355x_x8"), Parallel(tp=8)
    costs = step_costs(SimModel(), parallel, [Seq(1, 8192, "decode")] * 64)
    total = Cost.total(costs.values())
    assert total.weight_bytes > 0.5 * total.bytes
    t = step_time(costs, hw, parallel)
    by_bytes = sum(c.bytes / (8e12 * hw.efficiency[kernel_class(name)]) for name, c in costs.items())
    assert t.kernels_s <= by_bytes and t.kernels_s >= 0.9 * by_bytes
    assert t.host_s == pytest.approx(1e-3) and t.launch_s == pytest.approx(total.kernels * 5e-6)


def test_unknown_names_and_missing_profile_values_are_named():
    with pytest.raises(ValueError, match=r"cost 'flash': no kernel class"):
        kernel_class("flash")
    assert kernel_class("mtp_moe_experts") == "moe"
    with pytest.raises(ValueError, match=r"hardware cpu: the simulator needs memory_gb, bandwidth_tb_s"):
        step_time({}, HardwareConfig(name="cpu"), Parallel())
    with pytest.raises(ValueError, match=r"efficiency.gemm = 0.5 has no source"):
        HardwareConfig(name="x", efficiency={"gemm": 0.5})
    with pytest.raises(ValueError, match=r"efficiency: 'flash' is not a kernel class"):
        HardwareConfig(name="x", efficiency={"flash": 0.5}, sources={"efficiency.flash": "assumed"})
    with pytest.raises(ValueError, match=r"efficiency.gemm: invalid value 1.5"):
        HardwareConfig(name="x", efficiency={"gemm": 1.5}, sources={"efficiency.gemm": "assumed"})


@pytest.mark.parametrize("hardware", NODES)
def test_every_profile_value_has_a_source_or_says_assumed(hardware):
    hw = node(hardware)
    assert hw.is_modelled
    for name in ("memory_gb", "bandwidth_tb_s", "peak_bf16_tflops", "link_bandwidth_gb_s", "link_latency_us",
                 "launch_us", "host_overhead_us"):
        assert hw.sources[name].strip(), name
    assert all(hw.sources[f"efficiency.{k}"].startswith("assumed") for k in KERNEL_CLASSES)
