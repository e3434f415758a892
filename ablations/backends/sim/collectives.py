"""The collectives of a step as vLLM 0.32 runs them: which all-reduce algorithm a payload gets on a platform and
world size, and its seconds from the node's figures for that algorithm (README.md, "Collectives").

An all-reduce of P bytes over n ranks with algorithm a takes `latency_a + 2·(n − 1)/n · P / busbw_a` (busbw as
nccl-tests reports it); an all-gather or reduce-scatter of P bytes (NCCL / RCCL) `latency + (n − 1)/n · P / busbw`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ablations.hardware import HardwareConfig

MiB = 1024 * 1024


@dataclass(frozen=True)
class Rule:
    """vLLM uses `algorithm` for an all-reduce of fewer than `max_bytes` bytes (in the order the rules are listed;
    the last, NCCL / RCCL, takes every size). `where` is the vLLM 0.32 code that sets it."""

    algorithm: str
    max_bytes: float
    where: str


ONE_STAGE = Rule("ar_1stage", 256 * 1024, "csrc/custom_all_reduce.cuh: one stage below 256 KiB at 8 ranks, fully "
                 "connected (two stages above)")
# The all-reduces vLLM's device communicator tries in order at 8 ranks, bf16, by platform and compute capability
# (`distributed/device_communicators/cuda_communicator.py:362-446`; NCCL symmetric memory, QuickReduce and
# FlashInfer's PCIe path are off by default, AITER's custom all-reduce only with VLLM_ROCM_USE_AITER=1).
RULES: dict[str, tuple[Rule, ...]] = {
    "rocm": (
        ONE_STAGE,
        Rule("ar_2stage", 8 * MiB, "custom_all_reduce.py:141,513: max_size 8 MiB"),
        Rule("ccl", float("inf"), "pynccl.py: RCCL"),
    ),
    "cuda:10.3": (
        Rule("flashinfer", 64 * MiB, "flashinfer_all_reduce.py:143-178, all_reduce_utils.py:87-92: mnnvl on one "
             "node, FI_MNNVL_ALLREDUCE_MAX_SIZE_MB[(103, 8, 1)] = 64"),
        ONE_STAGE,
        Rule("ar_2stage", 4 * MiB, "all_reduce_utils.py:31-56: CUSTOM_ALL_REDUCE_MAX_SIZES['10.3'][8]"),
        Rule("symm_mem", 64 * MiB, "all_reduce_utils.py:58-83: SYMM_MEM_ALL_REDUCE_MAX_SIZES['10.3'][8]"),
        Rule("ccl", float("inf"), "pynccl.py: NCCL"),
    ),
    "cuda:10.0": (
        Rule("flashinfer", MiB, "allreduce_rms_fusion.py:104-115: FI_ALLREDUCE_FUSION_MAX_SIZE_MB[100][8]"),
        ONE_STAGE,
        Rule("ar_2stage", MiB, "all_reduce_utils.py:31-43: CUSTOM_ALL_REDUCE_MAX_SIZES['10.0'][8]"),
        Rule("symm_mem", 128 * MiB, "all_reduce_utils.py:58-70: SYMM_MEM_ALL_REDUCE_MAX_SIZES['10.0'][8]"),
        Rule("ccl", float("inf"), "pynccl.py: NCCL"),
    ),
    "cuda:9.0": (
        Rule("flashinfer", MiB // 2, "allreduce_rms_fusion.py:104-127: FI_ALLREDUCE_FUSION_MAX_SIZE_MB[90][8]"),
        ONE_STAGE,
        Rule("symm_mem", 64 * MiB, "all_reduce_utils.py:58-83: SYMM_MEM_ALL_REDUCE_MAX_SIZES['9.0'][8]"),
        Rule("ccl", float("inf"), "pynccl.py: NCCL"),
    ),
}


def rules(hw: HardwareConfig, tp: int) -> tuple[Rule, ...]:
    """The all-reduce rules on `hw` at `tp` ranks (NCCL / RCCL alone where vLLM's custom kernels are not modelled:
    another rank count, a device whose limits are not in `RULES`; none for one rank)."""
    if tp == 1:
        return ()
    key = hw.platform if hw.platform != "cuda" else f"cuda:{hw.capability}"
    if key not in RULES or tp != 8:
        return (Rule("ccl", float("inf"), f"no vLLM limits modelled for {key} at {tp} ranks"),)
    return RULES[key]


def choose(hw: HardwareConfig, tp: int, payload_bytes: float) -> str:
    """The algorithm vLLM runs an all-reduce of `payload_bytes` with."""
    for rule in rules(hw, tp):
        if payload_bytes < rule.max_bytes:
            return rule.algorithm
    raise ValueError(f"tp={tp}: one rank all-reduces nothing")


def algorithm_figures(hw: HardwareConfig, algorithm: str) -> tuple[float, float]:
    """An algorithm's latency (s) and bus bandwidth (bytes/s) on `hw`, or a ValueError naming the missing figure."""
    latency, busbw = getattr(hw, f"{algorithm}_us"), getattr(hw, f"{algorithm}_busbw_gb_s")
    if not busbw:
        raise ValueError(f"hardware {hw.name}: vLLM all-reduces with {algorithm} here and {algorithm}_us / "
                         f"{algorithm}_busbw_gb_s are not given; add them with their sources to "
                         f"conf/hardware/{hw.name}.yaml")
    return latency * 1e-6, busbw * 1e9


def allreduce_seconds(payload_bytes: np.ndarray | float, tp: int, hw: HardwareConfig) -> np.ndarray:
    """Seconds of one all-reduce of each payload (bytes; 0: none) over `tp` ranks, each with the algorithm vLLM
    chooses for its size."""
    payload = np.asarray(payload_bytes, dtype=float)
    out = np.zeros_like(payload)
    if tp == 1:
        return out
    done = payload <= 0
    for rule in rules(hw, tp):
        mine = ~done & (payload < rule.max_bytes)
        if mine.any():
            latency, busbw = algorithm_figures(hw, rule.algorithm)
            out[mine] = latency + 2 * (tp - 1) / tp * payload[mine] / busbw
        done |= mine
    return out


def gather_seconds(payload_bytes: float, ops: float, tp: int, hw: HardwareConfig) -> float:
    """Seconds of `ops` all-gathers or reduce-scatters moving `payload_bytes` in all (NCCL / RCCL)."""
    if tp == 1 or not ops:
        return 0.0
    latency, per_byte = seconds_per_gather_byte(tp, hw)
    return ops * latency + payload_bytes * per_byte


def seconds_per_gather_byte(tp: int, hw: HardwareConfig) -> tuple[float, float]:
    """An all-gather's latency and its seconds per byte of payload (the step model's linear terms)."""
    if tp == 1:
        return 0.0, 0.0
    latency, busbw = algorithm_figures(hw, "ccl")
    return latency, (tp - 1) / tp / busbw
