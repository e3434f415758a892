"""Every off and on path equals the float64 reference, and on equals off, on fresh seeded inputs.

The toggled mechanisms run the engine's functions (what the vLLM patches run and the microbenchmarks time), the
KDA states in slot pools laid out as vLLM's. Covers batch 1 (run as two rows), head counts and widths that are
not powers of two, non-zero conv/recurrent/block states, both KDA gate forms, every attention-residual variant
(no blocks, delta, block store), inputs small enough that every eps counts, NaN-poisoned outputs, NaN-filled
fresh allocations, and NaN-poisoned neighbours that must not be read.
"""

from __future__ import annotations

import pytest
import torch

from opts.fusion import (
    AttnResShape,
    KdaDecodeShape,
    MlaNormShape,
    attn_res_fused,
    attn_res_unfused,
    decode_args,
    kda_decode_slots_fused,
    kda_decode_slots_unfused,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    norm_args,
    q_kv_rms_norm,
    q_kv_rms_norm_fused,
)
from opts.fusion.reference import attn_res_reference, kda_decode_reference, mla_norm_reference

DTYPES = [torch.float32, torch.bfloat16]
NAN = float("nan")

# Each test compiles its passes with torch.compile (seconds apiece): the full tier only (`make test`).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 1e-3], ids=["unit", "small"])
@pytest.mark.parametrize("shape", [MlaNormShape(1, 96, 40, 8), MlaNormShape(3, 96, 40, 8)], ids=["n1", "n3"])
def test_mla_norm_matches_reference(shape, scale, dtype, close_out, nan_allocations):
    layer, qkv = make_mla_norm(shape, dtype, seed=11)
    qkv.mul_(scale)                                              # small: mean(x^2) ~ eps
    qkv[:, shape.q_lora_rank + shape.kv_lora_rank:] = NAN       # the rope part shares the row, never read
    q_ref, kv_ref = mla_norm_reference(layer, qkv)
    args = norm_args(layer, qkv)
    q_kv_rms_norm(*args), q_kv_rms_norm_fused(*args)            # compiled before allocations are poisoned
    with nan_allocations():
        q_off, kv_off = q_kv_rms_norm(*args)
        q_on, kv_on = q_kv_rms_norm_fused(*args)
    for name, got, ref in (("q off", q_off, q_ref), ("kv off", kv_off, kv_ref), ("q on", q_on, q_ref),
                           ("kv on", kv_on, kv_ref), ("q on-vs-off", q_on, q_off), ("kv on-vs-off", kv_on, kv_off)):
        close_out(got, ref, dtype, name)


KDA_CASES = [(KdaDecodeShape(1, num_heads=5, head_dim=16), -5.0), (KdaDecodeShape(3, num_heads=5, head_dim=16), None)]


def _kda_run(layer, step, nan_allocations):
    """Both paths on their own copies of the step, the second call of each with NaN-filled allocations and a
    NaN-poisoned output."""
    n, h, d = step.raw_g.shape
    kda_decode_slots_unfused(*decode_args(layer, step.clone(), torch.empty(n, h, d, dtype=step.raw_g.dtype)))
    kda_decode_slots_fused(*decode_args(layer, step.clone(), torch.empty(n, h, d, dtype=step.raw_g.dtype)))
    off_step, on_step = step.clone(), step.clone()
    out_off, out_on = (torch.full((n, h, d), NAN, dtype=step.raw_g.dtype) for _ in range(2))
    with nan_allocations():
        kda_decode_slots_unfused(*decode_args(layer, off_step, out_off))
        kda_decode_slots_fused(*decode_args(layer, on_step, out_on))
    return (out_off, off_step), (out_on, on_step)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "lower_bound"), KDA_CASES, ids=["n1-safe_gate", "n3-softplus_gate"])
def test_kda_decode_matches_reference(shape, lower_bound, dtype, close_out, close_state, nan_allocations):
    layer, step = make_kda_decode(shape, dtype, seed=7, lower_bound=lower_bound)
    assert step.state.abs().sum() > 0 and step.conv_state.abs().sum() > 0
    h, d = shape.num_heads, shape.head_dim
    step.mixed_qkv._base[:, 4 * h * d:4 * h * d + d] = NAN        # f_a shares the row and must not be read
    x_before = step.mixed_qkv.clone()
    out_ref, conv_ref, state_ref = kda_decode_reference(layer, step)
    (out_off, off_step), (out_on, on_step) = _kda_run(layer, step, nan_allocations)
    assert torch.equal(step.mixed_qkv, x_before), "x was written"
    close_out(out_off, out_ref, dtype, "out off")
    close_out(out_on, out_ref, dtype, "out on")
    close_out(out_on, out_off, dtype, "out on-vs-off")
    for name, s in (("off", off_step), ("on", on_step)):
        close_out(s.conv_state, conv_ref, dtype, f"conv_state {name}")
        close_state(s.state, state_ref, dtype, f"state {name}")
        assert torch.equal(s.conv_pool[0], step.conv_pool[0]), f"{name}: the null slot's window was written"
        assert torch.equal(s.state_pool[0], step.state_pool[0]), f"{name}: the null slot's state was written"


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe_gate", "softplus_gate"])
def test_kda_decode_small_inputs_where_every_eps_counts(lower_bound, close_out, close_state, nan_allocations):
    """q, k and o small enough that the L2-norm eps and the output-norm eps change the result."""
    layer, step = make_kda_decode(KdaDecodeShape(2, num_heads=3, head_dim=16), torch.float32, seed=4,
                                  lower_bound=lower_bound)
    for x in (step.mixed_qkv, step.conv_pool, step.state_pool):
        x.mul_(1e-3)
    out_ref, conv_ref, state_ref = kda_decode_reference(layer, step)
    for name, (out, s) in zip(("off", "on"), _kda_run(layer, step, nan_allocations), strict=True):
        close_out(out, out_ref, torch.float32, f"out {name}")
        close_out(s.conv_state, conv_ref, torch.float32, f"conv_state {name}")
        close_state(s.state, state_ref, torch.float32, f"state {name}")


def test_kda_decode_second_step_continues_from_updated_states(close_out, close_state):
    """Two steps in a row: the states each path stored to the pools are the ones the next step reads."""
    shape = KdaDecodeShape(3, num_heads=5, head_dim=16)
    layer, step = make_kda_decode(shape, torch.float32, seed=3, lower_bound=None)
    ref_step, off_step, on_step = step.clone(), step.clone(), step.clone()
    off_out, on_out = torch.empty(3, 5, 16), torch.empty(3, 5, 16)
    slots = step.slots.long()
    for _ in range(2):
        out_ref, conv_ref, state_ref = kda_decode_reference(layer, ref_step)
        ref_step.conv_pool[slots] = conv_ref.float()
        ref_step.state_pool[slots] = state_ref.float()
        kda_decode_slots_unfused(*decode_args(layer, off_step, off_out))
        kda_decode_slots_fused(*decode_args(layer, on_step, on_out))
    for name, out, s in (("off", off_out, off_step), ("on", on_out, on_step)):
        close_out(out, out_ref, torch.float32, f"out {name} after two steps")
        close_out(s.conv_state, ref_step.conv_state, torch.float32, f"conv_state {name} after two steps")
        close_state(s.state, ref_step.state, torch.float32, f"state {name} after two steps")


ATTN_RES_CASES = [
    AttnResShape(1, 0, hidden=48, max_blocks=4, has_delta=False),
    AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True),
    AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False, block_write=True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ATTN_RES_CASES, ids=["t1-no_blocks", "t3-3blocks-delta", "t2-2blocks-write"])
def test_attn_res_matches_reference(shape, dtype, close_out, nan_allocations):
    layer, step = make_attn_res(shape, dtype, seed=5)
    first_unused = shape.num_blocks + (1 if shape.block_write else 0)
    step.blocks[:, first_unused:] = NAN                            # slots past the sources must not be read
    out_ref, prefix_ref, blocks_ref = attn_res_reference(layer, step)
    attn_res_unfused(layer, step.clone()), attn_res_fused(layer, step.clone())
    off_step, on_step = step.clone(), step.clone()
    with nan_allocations():
        out_off = attn_res_unfused(layer, off_step)
        out_on = attn_res_fused(layer, on_step, torch.full_like(step.prefix, NAN))
    close_out(out_off, out_ref, dtype, "out off")
    close_out(out_on, out_ref, dtype, "out on")
    close_out(out_on, out_off, dtype, "out on-vs-off")
    for name, s in (("off", off_step), ("on", on_step)):
        close_out(s.prefix, prefix_ref, dtype, f"prefix {name}")
        close_out(s.blocks[:, :first_unused], blocks_ref[:, :first_unused], dtype, f"blocks {name}")
        assert torch.isnan(s.blocks[:, first_unused:]).all(), f"blocks {name}: an unused slot was written"


def test_attn_res_small_inputs_where_every_eps_counts(close_out):
    layer, step = make_attn_res(AttnResShape(2, 2, hidden=48, max_blocks=4), torch.float32, seed=6)
    for x in (step.prefix, step.blocks, step.delta):
        x.mul_(1e-3)
    out_ref, _, _ = attn_res_reference(layer, step)
    close_out(attn_res_unfused(layer, step.clone()), out_ref, torch.float32, "out off")
    close_out(attn_res_fused(layer, step.clone()), out_ref, torch.float32, "out on")


def test_attn_res_weights_follow_the_learned_query():
    """The mix is not a plain average: scoring one block far above the rest returns (the norm of) that block."""
    shape = AttnResShape(2, 3, hidden=48, max_blocks=4, has_delta=False)
    layer, step = make_attn_res(shape, torch.float32, seed=9)
    step.blocks[:, 1] = layer.res_proj_weight / layer.res_norm_weight * 50
    picked = step.blocks[:, 1]
    expected = picked * torch.rsqrt(picked.pow(2).mean(-1, keepdim=True) + layer.out_eps) * layer.out_norm_weight
    for path in (attn_res_fused, attn_res_unfused):
        torch.testing.assert_close(path(layer, step.clone()), expected, atol=1e-4, rtol=1e-4)


def test_inputs_are_checked_with_names():
    layer, step = make_kda_decode(KdaDecodeShape(2, num_heads=3, head_dim=8), torch.float32)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 8\)"):
        kda_decode_slots_fused(*decode_args(layer, step, torch.empty(2, 3, 9)))
    args = list(decode_args(layer, step, torch.empty(2, 3, 8)))
    args[7] = step.state_pool.to(torch.bfloat16)
    with pytest.raises(ValueError, match="state_pool: expected fp32"):
        kda_decode_slots_unfused(*args)
    layer, qkv = make_mla_norm(MlaNormShape(2, 32, 16, 8), torch.float32)
    q, kv, q_weight, kv_weight, eps = norm_args(layer, qkv)
    with pytest.raises(ValueError, match=r"kv_weight: expected shape \(15,\)"):
        q_kv_rms_norm(q, kv[:, :15], q_weight, kv_weight, eps)
    layer, step = make_attn_res(AttnResShape(2, 2, hidden=16, max_blocks=4), torch.float32)
    with pytest.raises(ValueError, match="block_write_idx: invalid value 1"):
        attn_res_fused(layer, type(step)(step.prefix, step.blocks, step.delta, 2, block_write_idx=1))
