"""Pieces of vLLM's K3 MLA layer (vllm/models/kimi_k3/nvidia/mla.py) that have no CPU implementation.

- S2: the fused epilogues `torch.ops._C.fused_kimi_k3_mla_*` (CUDA only): key concat, decode
  query concat and the paged latent-cache insert (bf16/fp32 cache; NoPE: no RoPE applied).
- S7: the chunked-context latent gather (`_gather_context_latent` calls CUDA-only cache ops):
  vLLM's own CPU gather `ops.gather_mla_context_cache_cpu`, as its generic MLA layer uses.
- S15: the Triton `fused_q_kv_rmsnorm` of the q-LoRA front end: vLLM's two RMSNorms, eager (stock vLLM-CPU's
  path; the fusion toggle's off and on both replace it with compiled passes).
"""

from __future__ import annotations

import torch

from ablations.backends.vllm.in_vllm.patches import original
from opts.k3 import rms_norm_native
from opts.vllm_setting import K3_VLLM


def _no_rope(positions: torch.Tensor | None, cos_sin_cache: torch.Tensor | None, where: str) -> None:
    if positions is not None or cos_sin_cache is not None:
        raise NotImplementedError(f"{where}: RoPE inside the MLA epilogue is not implemented on CPU (K3 MLA is NoPE)")


def insert_latent(
    kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """cache[slot] = [kv_c_normed | k_pe] for every slot >= 0 (cache [blocks, block_size, L+R])."""
    slots = slot_mapping.long()
    valid = slots >= 0
    if not bool(valid.all()):
        slots, kv_c_normed, k_pe = slots[valid], kv_c_normed[valid], k_pe[valid]
    block_size = kv_cache.shape[1]
    latent = torch.cat([kv_c_normed, k_pe.reshape(k_pe.shape[0], -1)], dim=-1)
    kv_cache[slots // block_size, slots % block_size] = latent.to(kv_cache.dtype)


def concat_key(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    """k = [k_nope | k_pe broadcast over heads], contiguous [T, H, nope+rope]."""
    k_pe = k_pe.reshape(k_pe.shape[0], 1, k_pe.shape[-1]).to(k_nope.dtype)
    return torch.cat([k_nope, k_pe.expand(-1, k_nope.shape[1], -1)], dim=-1)


def fused_mla_key_concat_kv_cache_insert(
    q, k_nope, k_pe, kv_c_normed, kv_cache, slot_mapping, positions=None, cos_sin_cache=None
) -> torch.Tensor:
    _no_rope(positions, cos_sin_cache, "fused_mla_key_concat_kv_cache_insert")
    if k_nope.shape[0]:
        insert_latent(kv_c_normed, k_pe, kv_cache, slot_mapping)
    return concat_key(k_nope, k_pe)


def fused_mla_decode_q_concat_kv_cache_insert(
    ql_nope, q_pe, kv_c_normed, k_pe, kv_cache, slot_mapping, *, ds_mla=False, q_scale_inv=None,
    cache_scale_inv=None, positions=None, cos_sin_cache=None,
) -> torch.Tensor:
    if ds_mla or q_scale_inv is not None:
        raise NotImplementedError("fused_mla_decode_q_concat_kv_cache_insert: fp8 KV caches are not supported on CPU")
    _no_rope(positions, cos_sin_cache, "fused_mla_decode_q_concat_kv_cache_insert")
    if ql_nope.shape[0]:
        insert_latent(kv_c_normed, k_pe, kv_cache, slot_mapping)
    return torch.cat([ql_nope, q_pe.to(ql_nope.dtype)], dim=-1)


def fused_mla_kv_concat(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    return concat_key(k_nope, k_pe)


def fused_q_kv_rmsnorm(qr, kv, q_weight, kv_weight, eps):
    """S15: the q and kv RMSNorms with vLLM's RMSNorm math (`vllm.ir.ops.rms_norm`, whose only CPU
    implementation is native torch ops), eager, each into a new tensor, as vLLM-CPU runs K3's layers."""
    return rms_norm_native(qr, q_weight, eps), rms_norm_native(kv, kv_weight, eps)


GATHER_TARGET = f"{K3_VLLM}.mla:MultiHeadLatentAttention._gather_context_latent"


def gather_context_latent(self, chunk, kv_cache, prefill, fp8_prefill) -> None:
    """Gather one context chunk's paged latent into the workspace with vLLM's CPU gather."""
    if fp8_prefill or self.kv_cache_dtype != "auto":
        return original(GATHER_TARGET)(self, chunk, kv_cache, prefill, fp8_prefill)
    from vllm import _custom_ops as ops

    ops.gather_mla_context_cache_cpu(
        src_cache=kv_cache,
        dst=prefill.chunked_context.workspace[: chunk.num_context_tokens],
        block_table=prefill.block_table[chunk.request_slice],
        starts=chunk.starts,
        cu_seq_lens=chunk.cu_seq_lens,
    )


def prepare_layer(layer) -> None:
    """After MultiHeadLatentAttention.__init__ (S1): keep kv_b_proj's weight (the CPU GEMM packer
    empties it, yet the layer reads it to absorb W_UK/W_UV), and run the output gate inline."""
    layer.kv_b_proj._cpu_skip_gemm_dispatch = True
    layer.aux_stream = None
    layer._gate_events = None


def run_prefill_context_chunk(self, chunk, q, k, v, out=None):
    """CPU SDPA context chunk that honours `out` as its `supports_out()` promises (S9)."""
    result = self._ragged_sdpa(
        q, k, v, chunk.query_start_loc, chunk.cu_seq_lens, causal=False, return_softmax_lse=True
    )
    attn_out, lse = result
    if out is None:
        return attn_out, lse
    out.copy_(attn_out)
    return out, lse
