"""Off: the portable paged split-KV MLA decode, the path stock vLLM takes without a vendor kernel (TRITON_MLA on
ROCm and CUDA is a split-KV decode of the same shape). Absorb W_UK into q, attend over the pages in tiles
merged by log-sum-exp (`split_kv.py`), apply W_UV.

`latent_decode` is the attention part alone (latent query in, latent output out), what vLLM's MLA layer asks
of its backend's `forward_mqa` (the layer absorbs W_UK before and applies W_UV after): the vLLM off patch
(`vllm.py`) and `decode` run the same function.
"""

from __future__ import annotations

import torch

from opts.aiter_mla import split_kv
from opts.k3.mla import (
    K3_TP8,
    MLAShape,
    absorb_query,
    check_block_ids,
    check_inputs,
    check_latent_inputs,
    check_lengths,
    up_project,
)


def latent_decode(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                  context_lens: torch.Tensor, scale: float, kv_lora_rank: int, *,
                  tiling: split_kv.Tiling | None = None) -> torch.Tensor:
    """Split-KV latent attention, one query token per request: q_latent [B, H, kv_lora + rope] over the paged
    kv_cache [num_blocks, block_size, kv_lora + rope] -> o_latent [B, H, kv_lora] in q_latent's dtype.

    block_table [B, max_blocks] and context_lens [B] (integer) give each request's pages and length.
    """
    check_latent_inputs(q_latent, kv_cache, block_table, context_lens, kv_lora_rank)
    lens = context_lens.tolist()
    check_lengths(lens, block_table.shape[1], kv_cache.shape[1])
    tiling = tiling or split_kv.default_tiling(kv_cache.device.type)
    split = split_kv.plan(block_table, lens, kv_cache.shape[1], tiling, kv_cache.shape[2] * kv_cache.element_size())
    check_block_ids(split.item_blocks, kv_cache.shape[0])
    return split_kv.latent_attention(q_latent, kv_cache, split, scale, kv_lora_rank).to(q_latent.dtype)


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
           out: torch.Tensor | None = None, tiling: split_kv.Tiling | None = None) -> torch.Tensor:
    """Absorbed MLA decode, one query token per request -> [B, H, v_head], written into `out` if given."""
    check_inputs(shape, q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, out)
    q_latent = absorb_query(q_nope, q_pe, w_uk)
    o_latent = latent_decode(q_latent, kv_cache, block_table, context_lens, shape.softmax_scale, shape.kv_lora_rank,
                             tiling=tiling)
    return up_project(o_latent, w_uv, out)
