"""On (ROCm): AITER's `mla_decode_fwd`, the assembly MLA decode vLLM's ROCM_AITER_MLA
backend calls. UNEXECUTED in this project so far (no ROCm device here): the metadata and
head padding below are tested on CPU, the kernel call itself is not.

The kernel sees the pool as pages of one token (`kv_buffer` [num_blocks * block_size, 1, 1, 576]),
so the block table becomes per-token indices, and it has no 12-head kernel: K3's 12 heads per rank
are padded to 16 by tiling them, and the extra heads are sliced off the output.
"""

from __future__ import annotations

import importlib.util

import torch

from opts.k3.mla import K3_TP8, MLAShape, absorbed_decode

AITER_HEAD_MULTIPLE = 16


def is_available() -> bool:
    """amd-aiter is importable (its import compiles kernels, so only its presence is checked here)."""
    try:
        return importlib.util.find_spec("aiter") is not None
    except (ImportError, ValueError):
        return False


def kernel_metadata(block_table: torch.Tensor, context_lens: list[int],
                    block_size: int) -> dict[str, torch.Tensor]:
    """qo_indptr, kv_indptr, kv_indices (pool token of each context token, request-major) and
    kv_last_page_lens, int32, for one decode token per request over pages of one token."""
    device = block_table.device
    batch = len(context_lens)
    lens = torch.tensor(context_lens, dtype=torch.int32, device=device)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    kv_indptr[1:] = lens.cumsum(0)
    request = torch.repeat_interleave(torch.arange(batch, device=device), lens.long())
    position = torch.arange(int(kv_indptr[-1]), device=device) - kv_indptr[:-1].long()[request]
    block = block_table.long()[request, position // block_size]
    kv_indices = (block * block_size + position % block_size).to(torch.int32)
    return {
        "qo_indptr": torch.arange(batch + 1, dtype=torch.int32, device=device),
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "kv_last_page_lens": torch.ones(batch, dtype=torch.int32, device=device),
    }


def pad_heads(q: torch.Tensor, multiple: int = AITER_HEAD_MULTIPLE) -> torch.Tensor:
    """[B, H, D] -> [B, ceil(H / multiple) * multiple, D]; the real heads come first, then repeats of them."""
    heads = q.shape[1]
    target = -(-heads // multiple) * multiple
    if target == heads:
        return q
    reps = -(-target // heads)
    return q.repeat(1, reps, 1)[:, :target].contiguous()


def latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: list[int], scale: float, kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] -> o_latent [B, H, kv_lora] through aiter.mla.mla_decode_fwd. UNEXECUTED."""
    from aiter.mla import mla_decode_fwd

    batch, heads, latent_dim = q_latent.shape
    meta = kernel_metadata(block_table, context_lens, kv_cache.shape[1])
    q = pad_heads(q_latent)
    o = torch.empty(batch, q.shape[1], kv_lora_rank, dtype=q_latent.dtype, device=q_latent.device)
    mla_decode_fwd(q, kv_cache.view(-1, 1, 1, latent_dim), o, meta["qo_indptr"], meta["kv_indptr"],
                   meta["kv_indices"], meta["kv_last_page_lens"], 1, sm_scale=scale)
    return o[:, :heads]


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA decode through AITER's kernel -> [B, H, v_head]. UNEXECUTED (needs ROCm and amd-aiter)."""
    return absorbed_decode(
        lambda q_latent, lens: latent_attention(q_latent, kv_cache, block_table, lens, shape.softmax_scale,
                                                shape.kv_lora_rank),
        q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, shape, out)
