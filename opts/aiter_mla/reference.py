"""The references every decode is tested against.

`decode`: the float64 truth, MLA in its un-absorbed form from W_UK and W_UV, token by token from the pages.
Every head gets its own keys [k_nope = W_UK c, k_pe] (192 wide) and values v = W_UV c (128 wide), so a wrong
absorption in a fast path shows up as a mismatch here.

`gather_decode`: the plainest absorbed decode in the cache dtype: per request, gather the pages into one
contiguous context, softmax (float32) over it, then W_UV. No vLLM backend runs this; it is a reference only.
"""

from __future__ import annotations

import torch

from opts.k3.mla import K3_TP8, MLAShape, absorbed_decode


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


def gather_latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                            context_lens: list[int], scale: float, kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] over each request's gathered context -> o_latent [B, H, kv_lora] (float32)."""
    num_blocks, block_size, latent_dim = kv_cache.shape
    pages = kv_cache.view(num_blocks, block_size * latent_dim)
    o = torch.empty(q_latent.shape[0], q_latent.shape[1], kv_lora_rank, dtype=torch.float32,
                    device=q_latent.device)
    for b, length in enumerate(context_lens):
        used_blocks = block_table[b, : (length + block_size - 1) // block_size].long()
        kv = torch.index_select(pages, 0, used_blocks).view(-1, latent_dim)[:length]
        p = torch.softmax((q_latent[b] @ kv.T).float() * scale, dim=-1)
        o[b] = p.to(kv.dtype) @ kv[:, :kv_lora_rank]
    return o


def gather_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                  context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gather-then-attend absorbed decode -> [B, H, v_head] in the cache dtype, written into `out` if given."""
    return absorbed_decode(
        lambda q_latent, lens: gather_latent_attention(q_latent, kv_cache, block_table, lens, shape.softmax_scale,
                                                       shape.kv_lora_rank),
        q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, shape, out)
