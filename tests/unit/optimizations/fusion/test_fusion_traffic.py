"""The analytic traffic of `traffic.py` against three instruments: a dispatch-level byte count and
torch.profiler for the off paths, torch.profiler and inductor's own accounting for the on paths."""

from __future__ import annotations

import pytest
import torch

from opts.fusion import (
    AttnResShape,
    KdaDecodeShape,
    MlaNormShape,
    attn_res_cost,
    attn_res_fused,
    attn_res_unfused,
    kda_decode_cost,
    kda_decode_fused,
    kda_decode_unfused,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    mla_norm_cost,
    mla_norm_fused,
    mla_norm_unfused,
)
from opts.fusion.cases import bench_cases
from opts.fusion.fused import _attn_res_body, _kda_decode_body, _mla_norm_body
from opts.fusion.measure import count_ops, inductor_account, profile_call

DTYPES = [torch.float32, torch.bfloat16]
SCALAR_BYTES = 8     # the profiler also sees 0-dim scalar temporaries that ops create internally


def _mla(shape, dtype):
    layer, qkv = make_mla_norm(shape, dtype)
    q_out = torch.empty(shape.num_tokens, shape.q_lora_rank, dtype=dtype)
    kv_out = torch.empty(shape.num_tokens, shape.kv_lora_rank, dtype=dtype)
    body_args = (qkv, layer.q_weight, layer.kv_weight, q_out, kv_out, shape.q_lora_rank, shape.kv_lora_rank,
                 layer.eps)
    return (mla_norm_cost(shape, dtype), lambda: mla_norm_unfused(layer, qkv),
            lambda: mla_norm_fused(layer, qkv, q_out, kv_out), (_mla_norm_body, *body_args))


def _kda(shape, dtype, lower_bound):
    layer, step = make_kda_decode(shape, dtype, lower_bound=lower_bound)
    off_step, on_step, body_step = step.clone(), step.clone(), step.clone()
    out = torch.empty(shape.num_tokens, shape.num_heads, shape.head_dim, dtype=dtype)
    s = body_step
    body_args = (s.mixed_qkv, s.conv_state, layer.conv_weight, s.raw_g, s.raw_beta, layer.A_log, layer.dt_bias,
                 s.state, s.output_gate, layer.norm_weight, out, lower_bound, layer.qk_scale, layer.norm_eps)
    return (kda_decode_cost(shape, dtype, lower_bound), lambda: kda_decode_unfused(layer, off_step, out),
            lambda: kda_decode_fused(layer, on_step, out), (_kda_decode_body, *body_args))


def _attn(shape, dtype):
    layer, step = make_attn_res(shape, dtype)
    off_step, on_step, s = step.clone(), step.clone(), step.clone()
    out = torch.empty_like(step.prefix)
    body_args = (s.prefix, s.delta, s.blocks, layer.res_norm_weight, layer.res_proj_weight, layer.out_norm_weight,
                 out, s.num_blocks, s.block_write_idx, layer.eps, layer.out_eps)
    return (attn_res_cost(shape, dtype), lambda: attn_res_unfused(layer, off_step),
            lambda: attn_res_fused(layer, on_step, out), (_attn_res_body, *body_args))


# The shapes of test_fusion_correctness.py, so the compiled on passes are shared.
BUILDS = {
    "mla_n1": lambda dt: _mla(MlaNormShape(1, 96, 40, 8), dt),
    "mla_n3": lambda dt: _mla(MlaNormShape(3, 96, 40, 8), dt),
    "kda_n1_safe_gate": lambda dt: _kda(KdaDecodeShape(1, num_heads=5, head_dim=16), dt, -5.0),
    "kda_n3_softplus_gate": lambda dt: _kda(KdaDecodeShape(3, num_heads=5, head_dim=16), dt, None),
    "attn_t1_no_blocks": lambda dt: _attn(AttnResShape(1, 0, hidden=48, max_blocks=4, has_delta=False), dt),
    "attn_t3_delta": lambda dt: _attn(AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True), dt),
    "attn_t2_write": lambda dt: _attn(AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False,
                                                   block_write=True), dt),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("build", list(BUILDS))
def test_off_traffic_matches_dispatch_count_and_profiler(build, dtype):
    cost, off, _, _ = BUILDS[build](dtype)
    counted = count_ops(off)
    assert counted.bytes == cost.off.bytes
    assert counted.kernels == cost.off.kernels
    assert (counted.allocations, counted.allocated) == (cost.off.allocations, cost.off.allocated)
    profiled = profile_call(off)
    assert profiled.num_kernels == cost.off.kernels, profiled.kernels
    extra = profiled.allocations - cost.off.allocations
    assert extra >= 0
    assert cost.off.allocated <= profiled.allocated <= cost.off.allocated + SCALAR_BYTES * extra


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("build", list(BUILDS))
def test_on_is_one_kernel_without_aten_ops(build, dtype):
    cost, _, on, _ = BUILDS[build](dtype)
    on()                                               # compiled outside the profile
    profiled = profile_call(on)
    assert cost.on.kernels == 1
    assert len(profiled.kernels) == 1 and "cpp_fused" in profiled.kernels[0], profiled.kernels
    assert cost.compulsory <= cost.on.bytes < cost.off.bytes


@pytest.mark.parametrize("build", ["mla_n3", "kda_n3_softplus_gate", "attn_t3_delta"])
def test_on_traffic_matches_inductor_and_is_below_off(build):
    """Inductor's own count of what its fused nodes read and write is below the off path's traffic, and the
    buffers its wrapper allocates are the intermediates `traffic.py` charges to the on path."""
    dtype = torch.bfloat16
    cost, off, _, (body, *args) = BUILDS[build](dtype)
    account = inductor_account(body, *args)
    assert account.bytes < count_ops(off).bytes
    assert account.bytes >= cost.compulsory
    assert account.allocated == pytest.approx(cost.on.allocated, rel=0.1, abs=64)


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_bench_case_moves_fewer_bytes_on_than_off(quick):
    for case in bench_cases(quick, "cpu"):
        info = case.info
        assert case.bytes == info["bytes_compulsory"] <= info["bytes_on"] < info["bytes_off"], case.name
        assert info["kernels_on"] < info["kernels_off"], case.name
        assert info["allocated_bytes_on"] < info["allocated_bytes_off"], case.name
