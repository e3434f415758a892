"""aiter_mla's microbenchmarks: one K3 MLA decode step (TP=8 rank), off against on, same inputs.

Off is the portable split-KV decode, on the platform's vendor decode (vLLM-CPU's kernel, AITER on ROCm). Where
on cannot run (NVIDIA CUDA, or its library not installed) the case's on_backend says "unavailable" and its
setup raises a ValueError saying why; nothing is substituted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.dispatch import OFF_BACKEND, make_decode, vendor_backend
from opts.aiter_mla.inputs import make_inputs
from opts.base import BenchCase, BenchPair
from opts.k3.mla import K3_TP8, decode_bytes, decode_flops

CPU_BLOCK_SIZE = 16  # the only block size vLLM-CPU's MLA kernel takes
GPU_BLOCK_SIZE = 64
DTYPE = torch.bfloat16
ATOL, RTOL = 4e-3, 1e-2  # on vs off, bf16, at these contexts (>= 4k): measured in README.md "Tolerance"
FULL = [(4096, 1), (4096, 16), (32768, 1), (32768, 16), (131072, 1), (131072, 16)]
QUICK = [(4096, 1), (4096, 16), (32768, 1)]


def block_size(device_type: str) -> int:
    """The cases' block size: 16 on the CPU (vLLM-CPU's kernel), 64 on a GPU."""
    return CPU_BLOCK_SIZE if device_type == "cpu" else GPU_BLOCK_SIZE


@dataclass(frozen=True)
class DecodeCase:
    """A decode step: one context length per request."""

    name: str
    context_lens: list[int]

    def __post_init__(self) -> None:
        if not self.context_lens or min(self.context_lens) < 1:
            raise ValueError(f"DecodeCase {self.name!r}: context_lens {self.context_lens!r}; need lengths >= 1")

    def to_bench_case(self, device: str) -> BenchCase:
        lens = self.context_lens
        device_type = torch.device(device).type
        block = block_size(device_type)
        elem = torch.tensor([], dtype=DTYPE).element_size()

        def setup() -> BenchPair:
            off = make_decode(AiterMLAConfig(mode="off"), device)
            on = make_decode(AiterMLAConfig(mode="on"), device)
            args = make_inputs(lens, block_size=block, dtype=DTYPE, device=device, seed=0).args()
            return BenchPair(off=lambda: off(*args), on=lambda: on(*args))

        return BenchCase(
            name=self.name,
            setup=setup,
            bytes=decode_bytes(K3_TP8, lens, elem),
            flops=decode_flops(K3_TP8, lens),
            info={"batch": len(lens), "context_tokens": sum(lens), "max_context": max(lens), "block_size": block,
                  "dtype": str(DTYPE).removeprefix("torch."), "latent_bytes": sum(lens) * K3_TP8.latent_dim * elem,
                  "off_backend": OFF_BACKEND,
                  "on_backend": vendor_backend(device_type, torch.version.hip is not None) or "unavailable"},
            atol=ATOL,
            rtol=RTOL,
        )


def case_name(context: int, batch: int) -> str:
    return f"ctx{context // 1024}k_b{batch}"


def decode_cases(quick: bool) -> list[DecodeCase]:
    """The case list: contexts 4k, 32k, 128k at batch 1 and 16 (quick: the three smallest)."""
    return [DecodeCase(case_name(c, b), [c] * b) for c, b in (QUICK if quick else FULL)]


def bench_cases(quick: bool, device: str) -> list[BenchCase]:
    """Optimization.bench_cases for aiter_mla."""
    return [case.to_bench_case(device) for case in decode_cases(quick)]
