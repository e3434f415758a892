"""Off: the portable paged split-KV MLA decode, the path stock vLLM takes without a vendor kernel (TRITON_MLA on
ROCm and CUDA is a split-KV decode of the same shape). Absorb W_UK into q, attend over the pages in tiles
merged by log-sum-exp (`split_kv.py`), apply W_UV."""

from __future__ import annotations

import torch

from opts.aiter_mla import split_kv
from opts.aiter_mla.mla import K3_TP8, MLAShape, absorb_query, check_block_ids, check_inputs, check_lengths, up_project


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
           out: torch.Tensor | None = None, tiling: split_kv.Tiling | None = None) -> torch.Tensor:
    """Absorbed MLA decode, one query token per request -> [B, H, v_head], written into `out` if given."""
    check_inputs(shape, q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, out)
    lens = context_lens.tolist()
    check_lengths(lens, block_table.shape[1], kv_cache.shape[1])
    tiling = tiling or split_kv.default_tiling(kv_cache.device.type)
    split = split_kv.plan(block_table, lens, kv_cache.shape[1], tiling, shape.latent_dim * kv_cache.element_size())
    check_block_ids(split.item_blocks, kv_cache.shape[0])
    q_latent = absorb_query(q_nope, q_pe, w_uk)
    o_latent = split_kv.latent_attention(q_latent, kv_cache, split, shape.softmax_scale, shape.kv_lora_rank)
    return up_project(o_latent, w_uv, out)
