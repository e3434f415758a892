"""A step's time on a modelled node: never below its roofline, the all-reduce by hand, the fit check's message,
and the profiles' values each with a source."""

from __future__ import annotations

import dataclasses

import pytest

from ablations.backends.sim.cost import Cost, Parallel, Seq, SimModel, step_costs
from ablations.backends.sim.timing import cache_capacity_gb, kernel_class, pass_times, roofline_s, step_time
from ablations.config import compose_app
from ablations.hardware import HardwareConfig

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
    ideal = dataclasses.replace(hw, efficiency=dict.fromkeys(hw.efficiency, 1.0), launch_us=0.0,
                                host_overhead_us=0.0)
    assert step_time(costs, ideal, parallel).kernels_s >= bound * (1 - 1e-12)


def test_k3_does_not_fit_on_h200_at_tp8_and_says_by_how_much():
    with pytest.raises(ValueError, match=r"kimi_k3 does not fit on h200_x8 at tp=8: its weights take 207.4 GB per "
                                         r"rank, 72.7 GB more than the 134.7 GB usable of 150.8 GB \(143771 MiB"):
        cache_capacity_gb(SimModel(), Parallel(tp=8), node("h200_x8"))


def test_hbm_capacity_is_read_in_the_vendors_unit():
    """AMD's 288 GB is 288 GiB (309.2·10^9 bytes), NVIDIA's B300 288 GB is 288·10^9 bytes: 9.5 GB more cache per
    MI355X rank than per B300 rank, from the same 207.4 GB of weights."""
    mi355x, b300 = node("mi355x_x8"), node("b300_x8")
    assert mi355x.memory_bytes == 288 * 2**30 and b300.memory_bytes == 288e9
    assert cache_capacity_gb(SimModel(), Parallel(tp=8), mi355x) == pytest.approx(
        288 * 2**30 / 1e9 * 0.92 - 4 - 207.4, abs=0.05)
    assert cache_capacity_gb(SimModel(), Parallel(tp=8), b300) == pytest.approx(288 * 0.92 - 4 - 207.4, abs=0.05)
    with pytest.raises(ValueError, match=r"memory_unit: invalid value 'TB'"):
        dataclasses.replace(mi355x, memory_unit="TB")


def test_the_weights_fit_check_keeps_the_reserve():
    """A node whose whole memory holds K3's weights but whose memory after vLLM's reserve (8%, and 4 GB of
    activations and graphs) does not: refused, by how much; 1 GB more after the reserve fits with 1 GB of cache."""
    weights = 207.4e9
    tight = dataclasses.replace(node("mi355x_x8"), memory=weights / 0.95 / 1e9, memory_unit="GB")
    assert tight.memory_bytes > weights
    with pytest.raises(ValueError, match=r"kimi_k3 does not fit on mi355x_x8 at tp=8: its weights take 207.4 GB"):
        cache_capacity_gb(SimModel(), Parallel(tp=8), tight)
    from ablations.backends.sim.cost import weights_per_rank
    exact = weights_per_rank(SimModel(), Parallel(tp=8))
    roomy = dataclasses.replace(tight, memory=(exact + 5e9) / 0.92 / 1e9)
    assert cache_capacity_gb(SimModel(), Parallel(tp=8), roomy) == pytest.approx(1.0, abs=1e-6)


def test_a_decode_step_is_mostly_weights_and_the_host():
    """64 decodes at 8k tokens on MI355X: weights are most of the bytes, and the step is bandwidth bound: its
    kernels take what their bytes take at each class's efficiency, within the launches and all-reduces."""
    hw, parallel = dataclasses.replace(node("mi355x_x8"), kernel_floor_us=0.0), Parallel(tp=8)
    costs = step_costs(SimModel(), parallel, [Seq(1, 8192, "decode")] * 64)
    total = Cost.total(costs.values())
    assert total.weight_bytes > 0.5 * total.bytes
    t = step_time(costs, hw, parallel)
    by_bytes = sum(c.bytes / (8e12 * hw.efficiency[kernel_class(name)]) for name, c in costs.items())
    assert t.kernels_s <= by_bytes and t.kernels_s >= 0.9 * by_bytes
    assert t.host_s == pytest.approx(hw.host_overhead_us * 1e-6) and t.launch_s == pytest.approx(total.kernels * 5e-6)


@pytest.mark.parametrize("hardware", NODES)
def test_a_pass_takes_at_least_its_kernels_at_the_floor(hardware):
    """kernel_floor_us: a pass of n kernels takes max(its roofline at its class's efficiency, n x the floor); at
    one decode the small passes sit on the floor, at 0 the floor is off."""
    hw, parallel = node(hardware), Parallel(tp=8)
    assert hw.kernel_floor_us > 0
    costs = step_costs(SimModel(), parallel, [Seq(1, 2000, "decode")])
    off = dataclasses.replace(hw, kernel_floor_us=0.0)
    floored = {p.name: p.kernels_s for p in pass_times(costs, hw, parallel)}
    plain = {p.name: p.kernels_s for p in pass_times(costs, off, parallel)}
    for name, cost in costs.items():
        assert floored[name] == pytest.approx(max(plain[name], cost.kernels * hw.kernel_floor_us * 1e-6), rel=1e-12)
    for part in pass_times(costs, hw, parallel):         # what explain prints as the floor's share
        assert part.floor_s == pytest.approx(floored[part.name] - plain[part.name], rel=1e-9, abs=1e-15)
    assert any(floored[n] > plain[n] for n in costs)
    assert step_time(costs, hw, parallel).kernels_s == pytest.approx(sum(floored.values()), rel=1e-12)


def test_unknown_names_and_missing_profile_values_are_named():
    with pytest.raises(ValueError, match=r"cost 'flash': no kernel class"):
        kernel_class("flash")
    assert kernel_class("mtp_moe_experts") == "moe"
    with pytest.raises(ValueError, match=r"hardware cpu: the simulator needs memory, bandwidth_tb_s"):
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
    for name in ("memory", "bandwidth_tb_s", "peak_bf16_tflops", "peak_fp8_tflops", "link_bandwidth_gb_s", "ccl_us",
                 "ccl_busbw_gb_s", "ar_1stage_us", "ar_2stage_us", "launch_us", "graph_launch_us", "graph_node_us",
                 "host_overhead_us"):
        assert hw.sources[name].strip(), name
    for key in hw.assumed:                      # every assumed value has a range around it
        low, high = hw.ranges[key]
        assert low <= hw.value(key) <= high and low < high, key
    for key, (low, high) in hw.ranges.items():  # a sourced value's range too
        assert low <= hw.value(key) <= high, key


def test_an_assumed_value_without_a_range_is_refused():
    hw = node("mi355x_x8")
    ranges = {k: v for k, v in hw.ranges.items() if k != "launch_us"}
    with pytest.raises(ValueError, match=r"hardware mi355x_x8: launch_us is assumed and has no range"):
        dataclasses.replace(hw, ranges=ranges)
    with pytest.raises(ValueError, match=r"ranges.launch_us: invalid value \[9, 6\]"):
        dataclasses.replace(hw, ranges={**hw.ranges, "launch_us": [9, 6]})
    with pytest.raises(ValueError, match=r"ranges.efficiency.gemm: high 1.2 is above 1"):
        dataclasses.replace(hw, ranges={**hw.ranges, "efficiency.gemm": [0.5, 1.2]})
