"""aiter_mla's microbenchmarks: one K3 MLA decode step (TP=8 rank), off against on, same inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opts.aiter_mla import aiter
from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.dispatch import make_decode, select_backend
from opts.aiter_mla.inputs import make_inputs
from opts.aiter_mla.mla import K3_TP8, decode_bytes, decode_flops
from opts.base import BenchCase, BenchPair

BLOCK_SIZE = 64
DTYPE = torch.bfloat16
FULL = [(4096, 1), (4096, 16), (32768, 1), (32768, 16), (131072, 1), (131072, 16)]
QUICK = [(4096, 1), (4096, 16), (32768, 1)]


@dataclass(frozen=True)
class DecodeCase:
    """A decode step: one context length per request."""

    name: str
    context_lens: list[int]

    def to_bench_case(self, device: str) -> BenchCase:
        lens = self.context_lens
        elem = torch.tensor([], dtype=DTYPE).element_size()
        on_backend = select_backend("on", "auto", torch.device(device).type, torch.version.hip is not None,
                                    aiter.is_available())

        def setup() -> BenchPair:
            inputs = make_inputs(lens, block_size=BLOCK_SIZE, dtype=DTYPE, device=device, seed=0)
            off = make_decode(AiterMLAConfig(mode="off"), device)
            on = make_decode(AiterMLAConfig(mode="on"), device)
            args = inputs.args()
            return BenchPair(off=lambda: off(*args), on=lambda: on(*args))

        latent_bytes = sum(lens) * K3_TP8.latent_dim * elem
        return BenchCase(
            name=self.name,
            setup=setup,
            bytes=decode_bytes(K3_TP8, lens, elem),
            flops=decode_flops(K3_TP8, lens),
            info={"batch": len(lens), "context_tokens": sum(lens), "max_context": max(lens),
                  "block_size": BLOCK_SIZE, "dtype": str(DTYPE).removeprefix("torch."),
                  "latent_bytes": latent_bytes, "off_backend": "naive", "on_backend": on_backend},
        )


def _name(context: int, batch: int) -> str:
    return f"ctx{context // 1024}k_b{batch}"


def decode_cases(quick: bool) -> list[DecodeCase]:
    """The case list: contexts 4k, 32k, 128k at batch 1 and 16 (quick: the three smallest)."""
    return [DecodeCase(_name(c, b), [c] * b) for c, b in (QUICK if quick else FULL)]


def bench_cases(quick: bool, device: str) -> list[BenchCase]:
    """Optimization.bench_cases for aiter_mla."""
    return [case.to_bench_case(device) for case in decode_cases(quick)]
