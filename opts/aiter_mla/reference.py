"""The float64 truth: MLA decode in its un-absorbed form, from W_UK and W_UV, token by token from the pages.

Every head gets its own keys [k_nope = W_UK c, k_pe] (192 wide) and values v = W_UV c (128 wide), so a wrong
absorption in a fast path shows up as a mismatch here.
"""

from __future__ import annotations

import torch

from opts.aiter_mla.mla import K3_TP8, MLAShape


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *,
           shape: MLAShape = K3_TP8) -> torch.Tensor:
    """[B, H, v_head] in float64."""
    f64 = torch.float64
    block_size = kv_cache.shape[1]
    rank = shape.kv_lora_rank
    outs = []
    for b, length in enumerate(context_lens.tolist()):
        tokens = torch.arange(length)
        pages = block_table[b].cpu().long()[tokens // block_size]
        latent = kv_cache.cpu()[pages, tokens % block_size].to(f64)              # [L, 576]
        c, k_pe = latent[:, :rank], latent[:, rank:]
        k_nope = torch.einsum("hdc,lc->hld", w_uk.cpu().to(f64), c)              # [H, L, qk_nope]
        v = torch.einsum("hvc,lc->hlv", w_uv.cpu().to(f64), c)                   # [H, L, v_head]
        k = torch.cat([k_nope, k_pe.expand(shape.num_heads, -1, -1)], dim=-1)    # [H, L, 192]
        q = torch.cat([q_nope[b], q_pe[b]], dim=-1).cpu().to(f64)                # [H, 192]
        p = torch.softmax(torch.einsum("hd,hld->hl", q, k) * shape.softmax_scale, dim=-1)
        outs.append(torch.einsum("hl,hlv->hv", p, v))
    return torch.stack(outs)
