"""fusion's microbenchmarks: each mechanism at K3's per-rank shapes (TP=8), off against on, same inputs.

Off and on each get their own copy of the states they update; the on pass is compiled in `setup`, so
compilation never lands in a timing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from opts.base import BenchCase, BenchPair
from opts.fusion.fused import attn_res_fused, kda_decode_fused, mla_norm_fused
from opts.fusion.inputs import make_attn_res, make_kda_decode, make_mla_norm
from opts.fusion.naive import attn_res_unfused, kda_decode_unfused, mla_norm_unfused
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape
from opts.fusion.traffic import PairCost, attn_res_cost, kda_decode_cost, mla_norm_cost

DTYPE = torch.bfloat16
DECODE_BATCHES = (1, 16, 64)
QUICK_BATCHES = DECODE_BATCHES
PREFILL_TOKENS = 2048          # one chunked-prefill chunk through the MLA norms
ATTN_RES_PREFILL_TOKENS = 256  # a prefill slice through the attention residual (its blocks are 8 x 14 KB a token)
LAST_BLOCKS = 7                # the deepest layers mix 7 completed blocks and the partial one


def _kda_flops(shape: KdaDecodeShape) -> int:
    n, h, d, c = shape.num_tokens, shape.num_heads, shape.head_dim, shape.channels
    return 2 * n * c * shape.conv_width + 7 * n * h * d * d + 12 * n * h * d


def _bench_case(name: str, mechanism: str, shape, cost: PairCost, flops: int,
                setup: Callable[[], BenchPair]) -> BenchCase:
    def warmed() -> BenchPair:
        pair = setup()
        pair.on()              # compiles the fused pass for these shapes (or finds it cached)
        return pair

    info = {"mechanism": mechanism, "dtype": str(DTYPE).removeprefix("torch."), **asdict(shape), **cost.info(),
            "on_backend": "inductor"}
    return BenchCase(name=name, setup=warmed, bytes=cost.compulsory, flops=flops, info=info)


def kda_decode_case(shape: KdaDecodeShape, device: str) -> BenchCase:
    def setup() -> BenchPair:
        layer, step = make_kda_decode(shape, DTYPE, device)
        off_step, on_step = step.clone(), step.clone()
        out_shape = (shape.num_tokens, shape.num_heads, shape.head_dim)
        off_out = torch.empty(out_shape, dtype=DTYPE, device=device)
        on_out = torch.empty(out_shape, dtype=DTYPE, device=device)
        return BenchPair(off=lambda: kda_decode_unfused(layer, off_step, off_out),
                         on=lambda: kda_decode_fused(layer, on_step, on_out))

    return _bench_case(f"kda_decode_n{shape.num_tokens}", "kda_decode", shape, kda_decode_cost(shape, DTYPE),
                       _kda_flops(shape), setup)


def mla_norm_case(shape: MlaNormShape, device: str) -> BenchCase:
    def setup() -> BenchPair:
        layer, qkv = make_mla_norm(shape, DTYPE, device)
        q_out = torch.empty(shape.num_tokens, shape.q_lora_rank, dtype=DTYPE, device=device)
        kv_out = torch.empty(shape.num_tokens, shape.kv_lora_rank, dtype=DTYPE, device=device)
        return BenchPair(off=lambda: mla_norm_unfused(layer, qkv), on=lambda: mla_norm_fused(layer, qkv, q_out, kv_out))

    flops = 4 * shape.num_tokens * (shape.q_lora_rank + shape.kv_lora_rank)
    return _bench_case(f"mla_norm_n{shape.num_tokens}", "mla_norm", shape, mla_norm_cost(shape, DTYPE), flops, setup)


def attn_res_case(shape: AttnResShape, device: str) -> BenchCase:
    def setup() -> BenchPair:
        layer, step = make_attn_res(shape, DTYPE, device)
        off_step, on_step = step.clone(), step.clone()
        out = torch.empty_like(step.prefix)
        return BenchPair(off=lambda: attn_res_unfused(layer, off_step), on=lambda: attn_res_fused(layer, on_step, out))

    row = shape.num_tokens * shape.hidden
    flops = 6 * row * shape.num_sources + 5 * row
    name = f"attn_res_t{shape.num_tokens}_b{shape.num_blocks}" + ("_write" if shape.block_write else "")
    return _bench_case(name, "attn_res", shape, attn_res_cost(shape, DTYPE), flops, setup)


def bench_cases(quick: bool, device: str) -> list[BenchCase]:
    """Optimization.bench_cases for fusion: decode batches 1, 16, 64 per mechanism, plus a prefill chunk
    through the MLA norms and the attention residual and a block-start residual (quick: the decode batches)."""
    batches = QUICK_BATCHES if quick else DECODE_BATCHES
    cases = [kda_decode_case(KdaDecodeShape(n), device) for n in batches]
    cases += [mla_norm_case(MlaNormShape(n), device) for n in batches]
    cases += [attn_res_case(AttnResShape(n, LAST_BLOCKS), device) for n in batches]
    if not quick:
        cases.append(mla_norm_case(MlaNormShape(PREFILL_TOKENS), device))
        cases.append(attn_res_case(AttnResShape(64, 3, has_delta=False, block_write=True), device))
        cases.append(attn_res_case(AttnResShape(ATTN_RES_PREFILL_TOKENS, LAST_BLOCKS), device))
    return cases
