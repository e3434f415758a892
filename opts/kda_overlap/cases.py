"""kda_overlap's microbenchmarks: K3-like mixed, verification-only and prefill-only steps, with analytic
bytes and flops (formulas in README.md)."""

from __future__ import annotations

from dataclasses import asdict

import torch

from opts.base import BenchCase, BenchPair
from opts.k3 import K3
from opts.kda_overlap.batch import StepOutput
from opts.kda_overlap.inputs import StepShape, random_step
from opts.kda_overlap.naive import CHUNK_SIZE, step_off
from opts.kda_overlap.step import step_on

# K3 per rank at TP=8: 96 KDA heads / 8 = 12, head dim 128, fp32 state; MTP K=3 -> K+1 = 4 tokens per row.
K3_HEADS, K3_HEAD_DIM = K3.kda_heads_per_rank(), K3.kda_head_dim
FULL_SHAPES = {
    "mixed_2x2048_prefill+32x4_verify": StepShape((2048, 2048), (4,) * 32, K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
    "verify_only_32x4": StepShape((), (4,) * 32, K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
    "prefill_only_2x2048": StepShape((2048, 2048), (), K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
}
QUICK_SHAPES = {
    "quick_mixed_2x256_prefill+32x4_verify": StepShape((256, 256), (4,) * 32, K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
    "quick_verify_only_32x4": StepShape((), (4,) * 32, K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
    "quick_prefill_only_2x256": StepShape((256, 256), (), K3_HEADS, K3_HEAD_DIM, K3_HEAD_DIM),
}
STATE_BYTES = 4
# on against off in fp32, outputs and states (measured max abs difference at the full shapes: see README.md)
TOLERANCE = 1e-5


def _chunks(length: int, chunk_size: int) -> list[int]:
    return [chunk_size] * (length // chunk_size) + ([length % chunk_size] if length % chunk_size else [])


def step_bytes(shape: StepShape, token_bytes: int = 4) -> int:
    """Bytes a step must move at least: tokens in (q, k, g, v, beta), o out, every starting state read once,
    prefill final states and every verification position's state written once."""
    t, h, dk, dv = shape.num_tokens, shape.num_heads, shape.dk, shape.dv
    tokens = t * h * (3 * dk + dv + 1) * token_bytes + t * h * dv * token_bytes
    num_seqs = len(shape.prefill_lens) + len(shape.verify_lens)
    states = (num_seqs + len(shape.prefill_lens) + sum(shape.verify_lens)) * h * dk * dv * STATE_BYTES
    return tokens + states


def step_flops(shape: StepShape, chunk_size: int = CHUNK_SIZE) -> int:
    """Flops of the chunked form (on's algorithm) per step; per head and chunk of L tokens:
    scores 4·L²·dk, UT solve L²·(dk+dv), [W; q]·S 4·L·dk·dv, A_qk·δ 2·L²·dv, state update 2·L·dk·dv
    (a prefill chunk) or the states after every position 3·L·dk·dv (a verification row)."""
    h, dk, dv = shape.num_heads, shape.dk, shape.dv
    total = 0
    rows = [(n, False) for n in shape.prefill_lens] + [(n, True) for n in shape.verify_lens]
    for length, is_verify in rows:
        for c in ([length] if is_verify and length else _chunks(length, chunk_size)):
            update = 3 * c * dk * dv if is_verify else 2 * c * dk * dv
            total += 4 * c * c * dk + c * c * (dk + dv) + 4 * c * dk * dv + 2 * c * c * dv + update
    return total * h


def make_case(name: str, shape: StepShape, device: str, *, dtype: torch.dtype = torch.float32,
              seed: int = 0) -> BenchCase:
    """One off/on pair over the same random step; off and on write into their own out= buffers."""

    def setup() -> BenchPair:
        batch = random_step(shape, dtype=dtype, seed=seed, device=device)
        out_off, out_on = StepOutput.empty(batch), StepOutput.empty(batch)
        return BenchPair(off=lambda: step_off(batch, out=out_off), on=lambda: step_on(batch, out=out_on))

    info = {"shape": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(shape).items()},
            "dtype": str(dtype).removeprefix("torch."), "chunk_size": CHUNK_SIZE}
    return BenchCase(name, setup, step_bytes(shape, torch.finfo(dtype).bits // 8), step_flops(shape), info,
                     atol=TOLERANCE, rtol=TOLERANCE)


def bench_cases(quick: bool, device: str) -> list[BenchCase]:
    """K3 per-rank shapes at TP=8; `quick` shortens the prefill chunks to 256 tokens."""
    shapes = QUICK_SHAPES if quick else FULL_SHAPES
    return [make_case(name, shape, device) for name, shape in shapes.items()]
