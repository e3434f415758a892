"""The dense absorbed MLA (draft_length's measured stack) against its float64 expanded reference, and one layer's
weights in vLLM's layout."""

import torch

from opts.k3.mla import MlaWeights, absorbed_attention, expanded_attention


def mla_inputs(dtype, seed=0, b=3, t=4, context=9, heads=2, rank=16, dn=8, dr=4, dv=8):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, heads, dn, generator=g, dtype=dtype),
            torch.randn(b, t, heads, dr, generator=g, dtype=dtype),
            torch.randn(b, context + t, rank + dr, generator=g, dtype=dtype),
            torch.randn(heads, dn, rank, generator=g, dtype=dtype) / 4,
            torch.randn(heads, dv, rank, generator=g, dtype=dtype) / 4, t, 0.3)


def test_absorbed_mla_equals_the_expanded_reference():
    inputs = mla_inputs(torch.float64)
    torch.testing.assert_close(absorbed_attention(*inputs), expanded_attention(*inputs), rtol=1e-12, atol=1e-12)
    fp32 = mla_inputs(torch.float32)
    torch.testing.assert_close(absorbed_attention(*fp32).double(), expanded_attention(*fp32), rtol=1e-4, atol=1e-5)


def test_mla_rows_only_see_the_context_and_earlier_new_tokens():
    q_nope, q_rope, latents, w_uk, w_uv, t, scale = mla_inputs(torch.float64)
    out = absorbed_attention(q_nope, q_rope, latents, w_uk, w_uv, t, scale)
    changed = latents.clone()
    changed[:, -1] += 5.0   # the last new token's latent: only the last row may move
    moved = absorbed_attention(q_nope, q_rope, changed, w_uk, w_uv, t, scale)
    torch.testing.assert_close(moved[:, :-1], out[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(moved[:, -1], out[:, -1])


def test_mla_layer_writes_its_latents_and_attends_causally():
    g = torch.Generator().manual_seed(0)
    layer = MlaWeights.random(32, 2, 16, 16, 8, 4, 8, g)
    assert (layer.w_uk.shape, layer.w_uv.shape, layer.latent_dim) == ((2, 8, 16), (2, 8, 16), 20)
    x = torch.randn(2, 3, 32, generator=g)
    latents = torch.full((2, 5, 20), float("nan"))
    latents[:, :2] = torch.randn(2, 2, 20, generator=g)
    out = layer.forward(x, latents, start=2)
    assert out.shape == (2, 3, 32) and not out.isnan().any() and not latents.isnan().any()
    first = layer.forward(x[:, :1], latents.clone(), start=2)
    torch.testing.assert_close(first, out[:, :1], rtol=1e-5, atol=1e-6)   # later tokens never reach earlier rows
