"""The analytic bytes and flops of a decode, checked against torch.profiler and the tensors themselves."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from opts.aiter_mla import K3_TP8, decode_bytes, decode_flops, make_inputs, naive, reference, split_kv

MATMULS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}


def profiled(fn, *args):
    with profile(activities=[ProfilerActivity.CPU], with_flops=True, profile_memory=True) as prof:
        fn(*args)
    return [e for e in prof.events() if e.cpu_parent is None or e.cpu_parent.name not in MATMULS]


def matmul_flops(events) -> int:
    return sum(e.flops for e in events if e.name in MATMULS)


@pytest.mark.parametrize("lens", [[256, 100, 1], [37]])
def test_gather_reference_flops_equal_the_analytic_count(lens: list[int]) -> None:
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    assert matmul_flops(profiled(reference.gather_decode, *inputs.args())) == decode_flops(K3_TP8, lens)


def test_off_flops_equal_the_analytic_count_when_tiles_fit_exactly() -> None:
    lens = [256, 512]
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    off = functools.partial(naive.decode, tiling=split_kv.Tiling(256, 1))
    assert matmul_flops(profiled(off, *inputs.args())) == decode_flops(K3_TP8, lens)


def test_off_flops_count_the_padding_of_last_tiles() -> None:
    lens = [256, 100]
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    tiling = split_kv.Tiling(256, 1)  # one tile per wave: the mm path, p.V over 512 columns
    plan = split_kv.plan(inputs.block_table, lens, 16, tiling, 576 * 4)
    padded = [plan.tile_tokens * n for n in torch.bincount(plan.item_request).tolist()]
    off = functools.partial(naive.decode, tiling=tiling)
    assert matmul_flops(profiled(off, *inputs.args())) == decode_flops(K3_TP8, padded)
    assert sum(padded) == plan.padded_tokens > sum(lens)


def test_bytes_are_the_latent_the_weights_and_the_activations() -> None:
    # The gather reference copies each context's latent exactly once: its allocations, as the profiler
    # records them, are the latent bytes (lengths are block multiples here). The rest is the tensors' size.
    lens, block_size = [256, 64, 128], 64
    inputs = make_inputs(lens, block_size=block_size, dtype=torch.bfloat16, spare_blocks=2)
    gathered = sum(e.cpu_memory_usage for e in profiled(reference.gather_decode, *inputs.args())
                   if e.name == "aten::index_select")
    latent = sum(lens) * K3_TP8.latent_dim * 2
    assert gathered == latent
    out = reference.gather_decode(*inputs.args())
    others = sum(t.numel() * t.element_size() for t in (inputs.w_uk, inputs.w_uv, inputs.q_nope, inputs.q_pe, out))
    assert decode_bytes(K3_TP8, lens, 2) == latent + others
