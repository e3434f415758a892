"""The analytic traffic of `traffic.py` against three instruments: a dispatch-level byte count of the eager
ops, torch.profiler's kernels and allocations (eager ones and those of compiled passes), and inductor's own
accounting of every compiled pass. The toggled mechanisms' paths are the engine's (the functions the vLLM patches
run), a one-row step included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
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
    decode_args,
    kda_decode_cost,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    mla_norm_cost,
    naive,
    norm_args,
    passes,
)
from opts.fusion.bench.measured_traffic import count_ops, inductor_account, profile_call
from opts.fusion.cases import bench_cases
from opts.fusion.fused import _attn_res_body

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
    args = norm_args(layer, qkv)
    rows = max(shape.num_tokens, 2)                       # one row runs as two (dynamic.as_two_rows)
    q_c, kv_c, q_weight, kv_weight, eps = norm_args(*make_mla_norm(replace(shape, num_tokens=rows), dtype))
    q, kv = torch.empty(q_c.shape, dtype=dtype), torch.empty(kv_c.shape, dtype=dtype)
    return Build(mla_norm_cost(shape, dtype), lambda: naive.q_kv_rms_norm(*args),
                 lambda: passes.q_kv_rms_norm_fused(*args),
                 [(naive._rms_norm_body, q_c, q_weight, q, eps), (naive._rms_norm_body, kv_c, kv_weight, kv, eps)],
                 (passes._q_kv_norm_body, q_c, kv_c, q_weight, kv_weight, eps))


def _kda(shape, dtype, lower_bound):
    layer, step = make_kda_decode(shape, dtype, lower_bound=lower_bound)
    out_shape = (shape.num_tokens, shape.num_heads, shape.head_dim)
    off = decode_args(layer, step.clone(), torch.empty(out_shape, dtype=dtype))
    on = decode_args(layer, step.clone(), torch.empty(out_shape, dtype=dtype))
    _, s = make_kda_decode(replace(shape, num_tokens=max(shape.num_tokens, 2)), dtype, lower_bound=lower_bound)
    out = torch.empty(s.raw_g.shape, dtype=dtype)
    conv_out, y = torch.empty(s.mixed_qkv.shape, dtype=dtype), torch.empty_like(out)
    off_bodies = [(naive._conv_slots_body, s.mixed_qkv, s.conv_pool, layer.conv_weight, s.slots),
                  (naive._recurrence_slots_body, conv_out, s.raw_g, s.raw_beta, layer.A_log, layer.dt_bias,
                   s.state_pool, s.slots, lower_bound, layer.qk_scale),
                  (naive._gated_norm_body, out, s.output_gate, layer.norm_weight, y, layer.norm_eps)]
    on_body = (passes._kda_decode_slots_body, *decode_args(layer, s, out))
    return Build(kda_decode_cost(shape, dtype), lambda: naive.kda_decode_slots_unfused(*off),
                 lambda: passes.kda_decode_slots_fused(*on), off_bodies, on_body)


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
    "mla_n1": lambda dt: _mla(MlaNormShape(1, 96, 40, 8), dt),
    "mla_n3": lambda dt: _mla(MlaNormShape(3, 96, 40, 8), dt),
    "kda_n1_safe_gate": lambda dt: _kda(KdaDecodeShape(1, num_heads=5, head_dim=16), dt, -5.0),
    "kda_n3_softplus_gate": lambda dt: _kda(KDA_SHAPE, dt, None),
    "attn_t1_no_blocks": lambda dt: _attn(AttnResShape(1, 0, hidden=48, max_blocks=4, has_delta=False), dt),
    "attn_t3_delta": lambda dt: _attn(AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True), dt),
    "attn_t2_write": lambda dt: _attn(AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False,
                                                   block_write=True), dt),
}
PASSES = ("compiled", "dynamic")


def _same_allocations(profiled, path, dtype) -> None:
    """The allocator's events during the call are the modelled ones (`PathCost.allocator_events`), plus only
    scalar temporaries (bf16; in fp32 inductor may keep more intermediates than the model's, which are bf16's)."""
    events = path.allocator_events
    if dtype != torch.bfloat16:
        assert profiled.allocated >= sum(path.eager_allocated)
        return
    extra = profiled.allocations - len(events)
    assert extra >= 0, (profiled.allocations, events)
    assert sum(events) <= profiled.allocated <= sum(events) + SCALAR_BYTES * extra


def _kind(profiled_kernel: str) -> str:
    if "cpp_fused" in profiled_kernel:
        return "pass"
    return "store" if profiled_kernel == "aten::index_put_" else "aten"


def _kinds(path) -> list[str]:
    return ["pass" if k.kind in PASSES else k.kind for k in path.steps]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("build", list(BUILDS))
def test_off_traffic_matches_dispatch_count_and_profiler(build, dtype):
    b = BUILDS[build](dtype)
    b.off()                                                # compiled outside the counts
    counted = count_ops(b.off)
    eager = b.cost.off.of_kind("aten", "store")
    assert [op.name for op in counted.ops] == [k.name for k in eager]
    assert [(op.read, op.written) for op in counted.ops] == [(k.read, k.written) for k in eager]
    allocated = b.cost.off.eager_allocated
    assert (counted.allocations, counted.allocated) == (len(allocated), sum(allocated))
    profiled = profile_call(b.off)
    assert [_kind(k) for k in profiled.kernels] == _kinds(b.cost.off), profiled.kernels
    _same_allocations(profiled, b.cost.off, dtype)


@pytest.mark.parametrize("build", list(BUILDS))
def test_off_compiled_passes_match_inductor(build):
    """Each compiled pass of the off path, compiled for its shapes: inductor's own count of what it reads and
    writes covers the stage's inputs and outputs, and the buffers its wrapper allocates are the new tensors and
    intermediates `traffic.py` charges (the engine's graphs, compiled for any token count, allocate the same:
    README.md)."""
    b = BUILDS[build](torch.bfloat16)
    passes = b.cost.off.of_kind(*PASSES)
    assert len(passes) == len(b.off_bodies)
    for kernel, (body, *args) in zip(passes, b.off_bodies, strict=True):
        account = inductor_account(body, *args)
        assert account.bytes >= kernel.read + kernel.written - 2 * sum(kernel.scratch) - sum(kernel.outputs), \
            kernel.name
        assert account.allocated == pytest.approx(sum(kernel.allocs), rel=0.1, abs=64), kernel.name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("build", list(BUILDS))
def test_on_is_one_compiled_pass_and_the_state_stores(build, dtype):
    b = BUILDS[build](dtype)
    b.on()                                               # compiled outside the profile
    counted = count_ops(b.on)
    eager = b.cost.on.of_kind("aten", "store")
    assert [(op.name, op.read, op.written) for op in counted.ops] == [(k.name, k.read, k.written) for k in eager]
    profiled = profile_call(b.on)
    assert _kinds(b.cost.on).count("pass") == 1
    assert [_kind(k) for k in profiled.kernels] == _kinds(b.cost.on), profiled.kernels
    _same_allocations(profiled, b.cost.on, dtype)
    assert b.cost.compulsory <= min(b.cost.on.bytes, b.cost.off.bytes)


@pytest.mark.parametrize("build", ["mla_n3", "kda_n3_softplus_gate", "attn_t3_delta", "attn_t2_write"])
def test_on_traffic_matches_inductor(build):
    """Inductor's own count of what the fused pass reads and writes is at least the compulsory bytes, and the
    buffers its wrapper allocates are the new tensors and intermediates `traffic.py` charges to the on path."""
    b = BUILDS[build](torch.bfloat16)
    body, *args = b.on_body
    account = inductor_account(body, *args)
    (kernel,) = b.cost.on.of_kind(*PASSES)
    assert account.bytes >= kernel.read + kernel.written - 2 * sum(kernel.scratch) - sum(kernel.outputs)
    assert account.allocated == pytest.approx(sum(kernel.allocs), rel=0.1, abs=64)


@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_every_bench_case_moves_the_compulsory_bytes_in_fewer_kernels_on(quick):
    """Fusion saves kernels; bytes are not asserted either way: inductor's fused pass materialises fp32
    intermediates that the stages hand over in bf16 (README.md, "Traffic")."""
    for case in bench_cases(quick, "cpu"):
        info = case.info
        assert case.bytes == info["bytes_compulsory"] <= min(info["bytes_on"], info["bytes_off"]), case.name
        assert info["kernels_on"] < info["kernels_off"], case.name
