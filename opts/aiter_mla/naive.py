"""Off: the decode a generic backend runs. Per request, gather the paged latent into a contiguous context,
softmax attention over it, then W_UV."""

from __future__ import annotations

import torch

from opts.aiter_mla.mla import K3_TP8, MLAShape, absorbed_decode


def latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: list[int], scale: float, kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] over each request's context -> o_latent [B, H, kv_lora] (float32)."""
    num_blocks, block_size, latent_dim = kv_cache.shape
    pages = kv_cache.view(num_blocks, block_size * latent_dim)
    o = torch.empty(q_latent.shape[0], q_latent.shape[1], kv_lora_rank, dtype=torch.float32,
                    device=q_latent.device)
    for b, length in enumerate(context_lens):
        used_blocks = block_table[b, : (length + block_size - 1) // block_size].long()
        kv = torch.index_select(pages, 0, used_blocks).view(-1, latent_dim)[:length]
        scores = (q_latent[b] @ kv.T).float() * scale
        p = torch.softmax(scores, dim=-1)
        o[b] = p.to(kv.dtype) @ kv[:, :kv_lora_rank]
    return o


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA decode, one query token per request -> [B, H, v_head], written into `out` if given."""
    return absorbed_decode(
        lambda q_latent, lens: latent_attention(q_latent, kv_cache, block_table, lens, shape.softmax_scale,
                                                shape.kv_lora_rank),
        q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, shape, out)
