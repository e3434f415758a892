"""The analytic bytes and flops of a decode, checked against torch.profiler and the tensors themselves."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from opts.aiter_mla import K3_TP8, decode_bytes, decode_flops, make_inputs, naive, split_kv
from opts.aiter_mla.bench import bench_cases, decode_cases

MATMULS = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"}


def profiled(fn, *args):
    with profile(activities=[ProfilerActivity.CPU], with_flops=True, profile_memory=True) as prof:
        fn(*args)
    return [e for e in prof.events() if e.cpu_parent is None or e.cpu_parent.name not in MATMULS]


def matmul_flops(events) -> int:
    return sum(e.flops for e in events if e.name in MATMULS)


@pytest.mark.parametrize("lens", [[256, 100, 1], [37]])
def test_off_flops_equal_the_analytic_count(lens: list[int]) -> None:
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    assert matmul_flops(profiled(naive.decode, *inputs.args())) == decode_flops(K3_TP8, lens)


def test_on_flops_equal_the_analytic_count_when_tiles_fit_exactly() -> None:
    lens = [256, 512]
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    on = functools.partial(split_kv.decode, tiling=split_kv.Tiling(256, 1))
    assert matmul_flops(profiled(on, *inputs.args())) == decode_flops(K3_TP8, lens)


def test_on_flops_count_the_padding_of_last_tiles() -> None:
    lens = [256, 100]
    inputs = make_inputs(lens, block_size=16, dtype=torch.float32)
    tiling = split_kv.Tiling(256, 1)  # one tile per wave: the mm path, p.V over 512 columns
    plan = split_kv.plan(inputs.block_table, lens, 16, tiling, 576 * 4)
    padded = [plan.tile_tokens * n for n in torch.bincount(plan.item_request).tolist()]
    on = functools.partial(split_kv.decode, tiling=tiling)
    assert matmul_flops(profiled(on, *inputs.args())) == decode_flops(K3_TP8, padded)
    assert sum(padded) == plan.padded_tokens > sum(lens)


def test_bytes_are_the_latent_the_weights_and_the_activations() -> None:
    # The off path's gather copies each context's latent exactly once: its allocations, as the profiler
    # records them, are the latent bytes (lengths are block multiples here). The rest is the tensors' size.
    lens, block_size = [256, 64, 128], 64
    inputs = make_inputs(lens, block_size=block_size, dtype=torch.bfloat16, spare_blocks=2)
    gathered = sum(e.cpu_memory_usage for e in profiled(naive.decode, *inputs.args())
                   if e.name == "aten::index_select")
    latent = sum(lens) * K3_TP8.latent_dim * 2
    assert gathered == latent
    out = naive.decode(*inputs.args())
    others = sum(t.numel() * t.element_size() for t in (inputs.w_uk, inputs.w_uv, inputs.q_nope, inputs.q_pe, out))
    assert decode_bytes(K3_TP8, lens, 2) == latent + others


def test_bench_cases_carry_the_analytic_costs() -> None:
    full = {c.name: c for c in bench_cases(False, "cpu")}
    assert set(full) == {"ctx4k_b1", "ctx4k_b16", "ctx32k_b1", "ctx32k_b16", "ctx128k_b1", "ctx128k_b16"}
    quick = [c.name for c in bench_cases(True, "cpu")]
    assert quick == ["ctx4k_b1", "ctx4k_b16", "ctx32k_b1"]
    for case in decode_cases(False):
        bench = full[case.name]
        assert bench.flops == decode_flops(K3_TP8, case.context_lens)
        assert bench.bytes == decode_bytes(K3_TP8, case.context_lens, 2)
        assert bench.info["latent_bytes"] == sum(case.context_lens) * 576 * 2
    assert full["ctx128k_b16"].info["context_tokens"] == 16 * 131072
