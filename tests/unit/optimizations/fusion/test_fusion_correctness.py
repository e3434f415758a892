"""Every fused pass equals its unfused path and the float64 reference, on fresh seeded inputs.

Covers batch 1, head counts and widths that are not powers of two, non-zero conv/recurrent/block states,
both KDA gate forms, every attention-residual variant (no blocks, delta, block store), NaN-poisoned out=
buffers and NaN-poisoned neighbours that must not be read.
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
    kda_decode_fused,
    kda_decode_unfused,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    mla_norm_fused,
    mla_norm_unfused,
)
from opts.fusion.reference import attn_res_reference, kda_decode_reference, mla_norm_reference

DTYPES = [torch.float32, torch.bfloat16]
NAN = float("nan")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [MlaNormShape(1, 96, 40, 8), MlaNormShape(3, 96, 40, 8)], ids=["n1", "n3"])
def test_mla_norm_matches_reference(shape, dtype, close_out):
    layer, qkv = make_mla_norm(shape, dtype, seed=11)
    qkv[:, shape.q_lora_rank + shape.kv_lora_rank:] = NAN       # the rope part passes through, never read
    q_ref, kv_ref = mla_norm_reference(layer, qkv)
    q_off, kv_off, pe_off = mla_norm_unfused(layer, qkv)
    q_out = torch.full((shape.num_tokens, shape.q_lora_rank), NAN, dtype=dtype)
    kv_out = torch.full((shape.num_tokens, shape.kv_lora_rank), NAN, dtype=dtype)
    q_on, kv_on, pe_on = mla_norm_fused(layer, qkv, q_out, kv_out)
    assert q_on is q_out and kv_on is kv_out
    for name, got, ref in (("q off", q_off, q_ref), ("kv off", kv_off, kv_ref), ("q on", q_on, q_ref),
                           ("kv on", kv_on, kv_ref), ("q on-vs-off", q_on, q_off), ("kv on-vs-off", kv_on, kv_off)):
        close_out(got, ref, dtype, name)
    assert pe_on.data_ptr() == pe_off.data_ptr() == qkv[:, -shape.rope_dim:].data_ptr()


KDA_CASES = [(KdaDecodeShape(1, num_heads=5, head_dim=16), -5.0), (KdaDecodeShape(3, num_heads=5, head_dim=16), None)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "lower_bound"), KDA_CASES, ids=["n1-safe_gate", "n3-softplus_gate"])
def test_kda_decode_matches_reference(shape, lower_bound, dtype, close_out, close_state):
    layer, step = make_kda_decode(shape, dtype, seed=7, lower_bound=lower_bound)
    assert step.state.abs().sum() > 0 and step.conv_state.abs().sum() > 0
    h, d = shape.num_heads, shape.head_dim
    step.mixed_qkv._base[:, 4 * h * d:4 * h * d + d] = NAN        # f_a shares the row and must not be read
    out_ref, conv_ref, state_ref = kda_decode_reference(layer, step)
    off_step, on_step = step.clone(), step.clone()
    out_off = kda_decode_unfused(layer, off_step, torch.full((shape.num_tokens, h, d), NAN, dtype=dtype))
    out_on = kda_decode_fused(layer, on_step, torch.full((shape.num_tokens, h, d), NAN, dtype=dtype))
    close_out(out_off, out_ref, dtype, "out off")
    close_out(out_on, out_ref, dtype, "out on")
    close_out(out_on, out_off, dtype, "out on-vs-off")
    for name, got in (("conv_state off", off_step.conv_state), ("conv_state on", on_step.conv_state)):
        close_out(got, conv_ref, dtype, name)
    close_state(off_step.state, state_ref, dtype, "state off")
    close_state(on_step.state, state_ref, dtype, "state on")


def test_kda_decode_second_step_continues_from_updated_states(close_out, close_state):
    """Two steps in a row: the states each path wrote in place are the ones the next step reads."""
    shape = KdaDecodeShape(3, num_heads=5, head_dim=16)
    layer, step = make_kda_decode(shape, torch.float32, seed=3, lower_bound=None)
    ref_step = step.clone()
    on_step = step.clone()
    out = torch.empty(3, 5, 16)
    for _ in range(2):
        out_ref, conv_ref, state_ref = kda_decode_reference(layer, ref_step)
        ref_step.conv_state.copy_(conv_ref)
        ref_step.state.copy_(state_ref)
        kda_decode_fused(layer, on_step, out)
    close_out(out, out_ref, torch.float32, "out after two steps")
    close_state(on_step.state, ref_step.state, torch.float32, "state after two steps")


ATTN_RES_CASES = [
    AttnResShape(1, 0, hidden=48, max_blocks=4, has_delta=False),
    AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True),
    AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False, block_write=True),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ATTN_RES_CASES, ids=["t1-no_blocks", "t3-3blocks-delta", "t2-2blocks-write"])
def test_attn_res_matches_reference(shape, dtype, close_out):
    layer, step = make_attn_res(shape, dtype, seed=5)
    first_unused = shape.num_blocks + (1 if shape.block_write else 0)
    step.blocks[:, first_unused:] = NAN                            # slots past the sources must not be read
    out_ref, prefix_ref, blocks_ref = attn_res_reference(layer, step)
    off_step, on_step = step.clone(), step.clone()
    out_off = attn_res_unfused(layer, off_step)
    out_on = attn_res_fused(layer, on_step, torch.full_like(step.prefix, NAN))
    close_out(out_off, out_ref, dtype, "out off")
    close_out(out_on, out_ref, dtype, "out on")
    close_out(out_on, out_off, dtype, "out on-vs-off")
    for name, s in (("off", off_step), ("on", on_step)):
        close_out(s.prefix, prefix_ref, dtype, f"prefix {name}")
        close_out(s.blocks[:, :first_unused], blocks_ref[:, :first_unused], dtype, f"blocks {name}")
        assert torch.isnan(s.blocks[:, first_unused:]).all(), f"blocks {name}: an unused slot was written"


def test_attn_res_weights_follow_the_learned_query():
    """The mix is not a plain average: scoring one block far above the rest returns (the norm of) that block."""
    shape = AttnResShape(2, 3, hidden=48, max_blocks=4, has_delta=False)
    layer, step = make_attn_res(shape, torch.float32, seed=9)
    step.blocks[:, 1] = layer.res_proj_weight / layer.res_norm_weight * 50
    out = attn_res_fused(layer, step.clone())
    picked = step.blocks[:, 1]
    expected = picked * torch.rsqrt(picked.pow(2).mean(-1, keepdim=True) + layer.out_eps) * layer.out_norm_weight
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_inputs_are_checked_with_names():
    layer, step = make_kda_decode(KdaDecodeShape(2, num_heads=3, head_dim=8), torch.float32)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 8\)"):
        kda_decode_fused(layer, step, torch.empty(2, 3, 9))
    layer, qkv = make_mla_norm(MlaNormShape(2, 32, 16, 8), torch.float32)
    with pytest.raises(ValueError, match="qkv_lora: expected"):
        mla_norm_unfused(layer, qkv[:, :50])
    layer, step = make_attn_res(AttnResShape(2, 2, hidden=16, max_blocks=4), torch.float32)
    with pytest.raises(ValueError, match="block_write_idx: invalid value 1"):
        attn_res_fused(layer, type(step)(step.prefix, step.blocks, step.delta, 2, block_write_idx=1))
