"""A step's time on a node: each kernel class's roofline time at the hardware profile's efficiency for that class,
plus kernel launches, the all-reduces over the node's links, and the host's work per step (README.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ablations.backends.sim.cost import STOCK, Cost, Mechanisms, Parallel, SimModel, kernel_time, weights_per_rank
from ablations.hardware import HardwareConfig

# Which kernel class each of cost.py's Cost names runs as (an MTP pass's "mtp_<name>" as <name>, the later MTP
# passes' "later_mtp_<name>" too).
KERNEL_CLASS = {
    "kda_proj": "gemm", "mla_proj": "gemm", "moe_router": "gemm", "moe_shared": "gemm", "moe_latent": "gemm",
    "dense_ffn": "gemm", "lm_head": "gemm", "proj": "gemm", "moe_experts": "moe", "mla_prefill": "attention",
    "mla_decode": "attention", "kda_prefill": "recurrent", "kda_recurrent": "recurrent", "attn_res": "elementwise",
    "embed": "elementwise", "mla_norm": "elementwise", "kda_streams": "recurrent",
}


def kernel_class(name: str, classes: dict[str, str] | None = None) -> str:
    """The kernel class of a Cost name (`classes`: a toggle's reassignments, `SimSetting.kernel_classes`)."""
    first = name.removeprefix("later_")         # a later MTP pass runs the kernels of the first
    if classes and first in classes:
        return classes[first]
    base = first.removeprefix("mtp_")
    if base not in KERNEL_CLASS:
        raise ValueError(f"cost {name!r}: no kernel class; known: {', '.join(sorted(KERNEL_CLASS))}")
    return KERNEL_CLASS[base]


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step on one rank, by part."""

    kernels_s: float
    launch_s: float
    comm_s: float
    host_s: float

    @property
    def total_s(self) -> float:
        return self.kernels_s + self.launch_s + self.comm_s + self.host_s


def _modelled(hw: HardwareConfig) -> None:
    if not hw.is_modelled:
        raise ValueError(f"hardware {hw.name}: the simulator needs {', '.join(hw.missing_figures)}")


def allreduce_s(payload_bytes: float, count: float, tp: int, hw: HardwareConfig) -> float:
    """`count` ring all-reduces (a gather counting half) over `tp` ranks moving `payload_bytes` in all: 2·(tp − 1)/tp
    of the payload over the link, 2·(tp − 1) hops of latency each."""
    if tp == 1 or not count:
        return 0.0
    return (2 * (tp - 1) / tp * payload_bytes / (hw.link_bandwidth_gb_s * 1e9)
            + count * 2 * (tp - 1) * hw.link_latency_us * 1e-6)


def efficiency(hw: HardwareConfig, kernel: str) -> float:
    """The profile's efficiency of a kernel class, or a ValueError naming the missing value."""
    if kernel not in hw.efficiency:
        raise ValueError(f"hardware {hw.name}: efficiency.{kernel} is not given; a toggle runs a kernel as "
                         f"{kernel!r} (add efficiency.{kernel} with its source to conf/hardware/{hw.name}.yaml)")
    return hw.efficiency[kernel]


def step_time(costs: dict[str, Cost], hw: HardwareConfig, parallel: Parallel,
              classes: dict[str, str] | None = None, tokens: int = 0, requests: int = 0, decodes: int = 0
              ) -> StepTime:
    """The step's time: each cost name a pass of its own, one after the other on one stream, at max(FLOPs /
    (peak·eff), bytes / (bandwidth·eff)) with its kernel class's efficiency (BF16 peak: the experts run W4A16);
    launches × launch cost, the all-reduces, the host's overhead (per step, per token of the `tokens`, per
    request of the `requests` and per decode of the `decodes` the step schedules)."""
    _modelled(hw)
    peak, bandwidth = hw.peak_bf16_tflops * 1e12, hw.bandwidth_tb_s * 1e12
    comm = Cost.total(costs.values())
    kernels = 0.0
    for name, cost in costs.items():
        e = efficiency(hw, kernel_class(name, classes))
        kernels += kernel_time(cost, peak, bandwidth, e, e)
    launches = comm.kernels * hw.launch_us * 1e-6
    return StepTime(kernels, launches, allreduce_s(comm.comm_bytes, comm.collectives, parallel.tp, hw),
                    host_seconds(hw, tokens, requests, decodes) if costs else 0.0)


def host_seconds(hw: HardwareConfig, tokens: int | float, requests: int | float = 0, decodes: int | float = 0
                 ) -> float:
    """The host's work for a step that schedules `tokens` tokens of `requests` requests, `decodes` of them decodes
    or verifications: per step, plus per token, plus per request, plus per decode."""
    return (hw.host_overhead_us + tokens * hw.host_us_per_token + requests * hw.host_us_per_request
            + decodes * hw.host_us_per_decode) * 1e-6


def roofline_s(costs: dict[str, Cost], hw: HardwareConfig) -> float:
    """The step's physical lower bound: all its FLOPs at peak or all its bytes at full bandwidth, whichever is
    longer, and nothing else."""
    total = Cost.total(costs.values())
    return max(total.flops / (hw.peak_bf16_tflops * 1e12), total.bytes / (hw.bandwidth_tb_s * 1e12))


def cache_capacity_gb(model: SimModel, parallel: Parallel, hw: HardwareConfig, reserve_fraction: float = 0.1,
                      mech: Mechanisms = STOCK) -> float:
    """GB per rank left for the KV cache and KDA states after the weights and `reserve_fraction` of the memory
    (activations, graphs); a model that does not fit is a ValueError saying by how much."""
    _modelled(hw)
    weights = weights_per_rank(model, parallel, mech) / 1e9
    usable = hw.memory_gb * (1 - reserve_fraction)
    if weights > usable:
        raise ValueError(f"{model.spec.name} does not fit on {hw.name} at tp={parallel.tp}: its weights take "
                         f"{weights:.1f} GB per rank, {weights - usable:.1f} GB more than the {usable:.1f} GB usable "
                         f"of {hw.memory_gb:g} GB ({reserve_fraction:.0%} kept for activations)")
    return usable - weights
