"""aiter_mla's code inside vLLM's processes: off's `CPUMLAImpl.forward_mqa`, the portable split-KV decode where
stock vLLM-CPU calls its own kernel (what `vllm.py`'s CPU patch installs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opts.aiter_mla import naive, split_kv


def portable_forward_mqa(tiling: split_kv.Tiling) -> Callable[..., tuple[Any, None]]:
    """A `CPUMLAImpl.forward_mqa` that runs off (`naive.latent_decode`) where stock calls vLLM-CPU's kernel.

    Same contract as stock: q is the absorbed latent query [decode tokens, H, kv_lora + rope] (or its
    (ql_nope, q_pe) halves), the cache [blocks, 16, kv_lora + rope]; out is o_latent [tokens, H, kv_lora] in q's
    dtype and no LSE (CPU_MLA never returns one). CPU_MLA's decode takes one query token per request
    (QueryLenSupport.SINGLE_ONLY), as both kernels do: more rows than requests is an error.
    """

    def forward_mqa(self: Any, q: Any, kv_c_and_k_pe_cache: Any, attn_metadata: Any, layer: Any) -> tuple[Any, None]:
        decode = attn_metadata.decode
        if decode is None:
            raise ValueError("aiter_mla off: forward_mqa called without decode metadata")
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        if q.shape[0] != decode.block_table.shape[0]:
            raise ValueError(f"aiter_mla off: {q.shape[0]} decode query rows for {decode.block_table.shape[0]} "
                             "requests; the portable decode takes one query token per request")
        out = naive.latent_decode(q, kv_c_and_k_pe_cache, decode.block_table, decode.seq_lens, self.scale,
                                  self.kv_lora_rank, tiling=tiling)
        return out, None

    return forward_mqa
