"""A step's time on a node: each kernel class's roofline time at the hardware profile's efficiency for that class,
plus kernel launches, the all-reduces over the node's links, and the host's work per step (README.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ablations.backends.sim.collectives import allreduce_seconds, gather_seconds
from ablations.backends.sim.cost import STOCK, Cost, Mechanisms, Parallel, SimModel, kernel_time, weights_per_rank
from ablations.backends.sim.graphs import kernel_seconds
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


def comm_seconds(cost: Cost, tp: int, hw: HardwareConfig) -> float:
    """Seconds of one cost name's collectives: its all-reduces (each of comm_bytes / collectives bytes, with the
    algorithm vLLM picks for that size) and its all-gathers and reduce-scatters."""
    out = gather_seconds(cost.gather_bytes, cost.gathers, tp, hw)
    if cost.collectives and tp > 1:
        out += cost.collectives * float(allreduce_seconds(cost.comm_bytes / cost.collectives, tp, hw))
    return out


def peak_flops(hw: HardwareConfig, kernel: str, precisions: dict[str, str] | None = None) -> float:
    """FLOP/s at the dense peak of the precision a kernel class computes in (`precisions`, by class: the model's
    weight formats; bf16 where not given)."""
    return hw.peak_flops((precisions or {}).get(kernel, "bf16"))


def efficiency(hw: HardwareConfig, kernel: str) -> float:
    """The profile's efficiency of a kernel class, or a ValueError naming the missing value."""
    if kernel not in hw.efficiency:
        raise ValueError(f"hardware {hw.name}: efficiency.{kernel} is not given; a toggle runs a kernel as "
                         f"{kernel!r} (add efficiency.{kernel} with its source to conf/hardware/{hw.name}.yaml)")
    return hw.efficiency[kernel]


@dataclass(frozen=True)
class PassTime:
    """One cost name's seconds on one rank: its kernels at their class's roofline, their launches, its
    collectives."""

    name: str
    kernel_class: str
    kernels_s: float
    launch_s: float
    comm_s: float
    floor_s: float = 0.0        # what of kernels_s the kernel floor adds over the roofline


def pass_times(costs: dict[str, Cost], hw: HardwareConfig, parallel: Parallel,
               classes: dict[str, str] | None = None, *, mode: str = "eager",
               precisions: dict[str, str] | None = None) -> list[PassTime]:
    """Each pass of a step launched in `mode` (`graphs.Graphs.step_mode`), priced as `step_time` prices it: its
    kernels at their roofline, or at `kernel_floor_us` each where that is longer."""
    bandwidth = hw.bandwidth_tb_s * 1e12
    out = []
    for name, cost in costs.items():
        k = kernel_class(name, {**hw.stock_classes, **(classes or {})})
        e = efficiency(hw, k)
        roof = kernel_time(cost, peak_flops(hw, k, precisions), bandwidth, e, e)
        busy = max(roof, cost.kernels * hw.kernel_floor_us * 1e-6)
        out.append(PassTime(name, k, busy, cost.kernels * kernel_seconds(name, mode, hw),
                            comm_seconds(cost, parallel.tp, hw), busy - roof))
    return out


def step_time(costs: dict[str, Cost], hw: HardwareConfig, parallel: Parallel,
              classes: dict[str, str] | None = None, tokens: int = 0, requests: int = 0, decodes: int = 0, *,
              launch: tuple[str, int] = ("eager", 0), precisions: dict[str, str] | None = None) -> StepTime:
    """The step's time: each cost name a pass of its own, one after the other on one stream, at max(FLOPs / (peak·eff),
    bytes / (bandwidth·eff), kernels · kernel_floor_us) with its kernel class's efficiency and the peak of the precision
    the class computes in (`precisions`); the launches of a step launched as `launch` = (mode, graph replays:
    `graphs.Graphs`); the collectives, each all-reduce with the algorithm vLLM picks for its size; the host's overhead
    (per step, per token of the `tokens`, per request of the `requests` and per decode of the `decodes` the step
    schedules)."""
    _modelled(hw)
    mode, replays = launch
    parts = pass_times(costs, hw, parallel, classes, mode=mode, precisions=precisions)
    return StepTime(sum(p.kernels_s for p in parts), sum(p.launch_s for p in parts) + replays * hw.graph_launch_us
                    * 1e-6, sum(p.comm_s for p in parts),
                    host_seconds(hw, tokens, requests, decodes) if costs else 0.0)


def host_seconds(hw: HardwareConfig, tokens: int | float, requests: int | float = 0, decodes: int | float = 0
                 ) -> float:
    """The host's work for a step that schedules `tokens` tokens of `requests` requests, `decodes` of them decodes
    or verifications: per step, plus per token, plus per request, plus per decode."""
    return (hw.host_overhead_us + tokens * hw.host_us_per_token + requests * hw.host_us_per_request
            + decodes * hw.host_us_per_decode) * 1e-6


def roofline_s(costs: dict[str, Cost], hw: HardwareConfig, precisions: dict[str, str] | None = None) -> float:
    """The step's physical lower bound: all its FLOPs at their precision's peak or all its bytes at full
    bandwidth, whichever is longer, and nothing else."""
    flops_s = sum(c.flops / peak_flops(hw, kernel_class(n), precisions) for n, c in costs.items())
    return max(flops_s, Cost.total(costs.values()).bytes / (hw.bandwidth_tb_s * 1e12))


def cache_capacity_gb(model: SimModel, parallel: Parallel, hw: HardwareConfig, utilization: float = 0.92,
                      non_kv_gb: float = 4.0, mech: Mechanisms = STOCK) -> float:
    """GB (10^9 bytes) per rank left for the KV cache and KDA states as vLLM sizes it: `utilization` of the memory
    (gpu_memory_utilization) less the weights and `non_kv_gb` of activations and graph pools; a model whose
    weights do not fit is a ValueError saying by how much."""
    _modelled(hw)
    weights = weights_per_rank(model, parallel, mech) / 1e9
    memory = hw.memory_bytes / 1e9
    usable = memory * utilization - non_kv_gb
    if weights > usable:
        raise ValueError(f"{model.spec.name} does not fit on {hw.name} at tp={parallel.tp}: its weights take "
                         f"{weights:.1f} GB per rank, {weights - usable:.1f} GB more than the {usable:.1f} GB usable "
                         f"of {memory:.1f} GB ({hw.memory:g} {hw.memory_unit}; gpu_memory_utilization "
                         f"{utilization:g}, {non_kv_gb:g} GB kept for activations and graphs)")
    return usable - weights
