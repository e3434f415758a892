"""fusion's microbenchmarks: each mechanism at K3's per-rank shapes (TP=8), off against on, same inputs.

The toggled mechanisms time the functions the vLLM patches run (`naive.q_kv_rms_norm` and
`passes.q_kv_rms_norm_fused`; `naive.kda_decode_slots_unfused` and `passes.kda_decode_slots_fused` over slot
pools laid out as vLLM's), compiled for any token count as in an engine. Off and on each get their own copy of
the states they update and return them with their output. Every compiled pass is compiled in `setup` on
throwaway copies, so compilation never lands in a timing and the pair's first calls start from identical states.
`attn_res` cases are counterfactual (named so, and `info["counterfactual"]`): beside the toggle's numbers, never
in them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from opts.base import BenchCase, BenchPair
from opts.fusion.counterfactual import attn_res_unfused
from opts.fusion.fused import attn_res_fused
from opts.fusion.inputs import decode_args, make_attn_res, make_kda_decode, make_mla_norm, norm_args
from opts.fusion.naive import kda_decode_slots_unfused, q_kv_rms_norm
from opts.fusion.passes import kda_decode_slots_fused, q_kv_rms_norm_fused
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
KDA_TOL = (1.3e-2, 1e-2)
MLA_TOL = (0.0, 1e-2)
ATTN_RES_TOL = (0.0, 2e-2)


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

    info = {"dtype": str(DTYPE).removeprefix("torch."), **asdict(shape), **cost.info(), **info}
    return BenchCase(name=name, setup=setup, bytes=cost.compulsory, flops=flops, info=info,
                     atol=tol[0], rtol=tol[1])


def kda_decode_case(shape: KdaDecodeShape, device: str) -> BenchCase:
    out_shape = (shape.num_tokens, shape.num_heads, shape.head_dim)

    def build() -> Callable[[], BenchPair]:
        layer, step = make_kda_decode(shape, DTYPE, device)

        def make_pair() -> BenchPair:
            off_step, on_step = step.clone(), step.clone()
            off = decode_args(layer, off_step, torch.empty(out_shape, dtype=DTYPE, device=device))
            on = decode_args(layer, on_step, torch.empty(out_shape, dtype=DTYPE, device=device))
            return BenchPair(
                off=lambda: (kda_decode_slots_unfused(*off), off_step.conv_pool, off_step.state_pool),
                on=lambda: (kda_decode_slots_fused(*on), on_step.conv_pool, on_step.state_pool))

        return make_pair

    info = {"mechanism": "kda_decode", "counterfactual": False,
            "off_backend": "naive.kda_decode_slots_unfused: conv, recurrence and gated norm one dynamic inductor pass "
                           "each over vLLM's slot pools, 2 state stores, 2 copies",
            "on_backend": "passes.kda_decode_slots_fused: one dynamic inductor pass, 2 state stores"}
    return _bench_case(f"kda_decode_n{shape.num_tokens}", shape, kda_decode_cost(shape, DTYPE),
                       _kda_flops(shape), KDA_TOL, build, info)


def mla_norm_case(shape: MlaNormShape, device: str) -> BenchCase:
    def build() -> Callable[[], BenchPair]:
        args = norm_args(*make_mla_norm(shape, DTYPE, device))
        return lambda: BenchPair(off=lambda: q_kv_rms_norm(*args), on=lambda: q_kv_rms_norm_fused(*args))

    info = {"mechanism": "mla_norm", "counterfactual": False,
            "off_backend": "naive.q_kv_rms_norm: vLLM's native RMSNorm, one dynamic inductor pass per norm",
            "on_backend": "passes.q_kv_rms_norm_fused: one dynamic inductor pass"}
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
            "off_backend": "counterfactual (vLLM has no unfused path): mix pass + RMSNorm pass, inductor each",
            "on_backend": "inductor"}
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
