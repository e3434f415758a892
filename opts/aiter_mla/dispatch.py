"""The toggle as a transform: a config and a device in, the decode function that runs out."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from opts.aiter_mla import aiter, naive, split_kv
from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.mla import K3_TP8, MLAShape, absorbed_decode

BACKENDS = ("naive", "split_kv", "aiter")
Decode = Callable[..., torch.Tensor]


def select_backend(mode: str, on_backend: str, device_type: str, is_hip: bool, has_aiter: bool) -> str:
    """Which decode runs: "naive" when off; when on, "aiter" on a ROCm GPU with amd-aiter (or when asked
    for, which is an error anywhere else), otherwise "split_kv"."""
    if mode == "off":
        return "naive"
    can_aiter = device_type == "cuda" and is_hip and has_aiter
    if on_backend == "aiter" and not can_aiter:
        raise ValueError("aiter_mla: on_backend='aiter' needs a ROCm GPU and amd-aiter installed; here "
                         f"device={device_type!r}, ROCm={is_hip}, aiter installed={has_aiter}; valid choices "
                         "here: auto, split_kv")
    if on_backend == "split_kv" or not can_aiter:
        return "split_kv"
    return "aiter"


def aiter_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                 context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, *, shape: MLAShape = K3_TP8,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Absorbed MLA decode through AITER's kernel. UNEXECUTED (needs ROCm and amd-aiter)."""
    return absorbed_decode(
        lambda q_latent, lens: aiter.latent_attention(q_latent, kv_cache, block_table, lens, shape.softmax_scale,
                                                shape.kv_lora_rank),
        q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, shape, out)


def make_decode(config: AiterMLAConfig, device: str | torch.device = "cpu") -> Decode:
    """The decode `config` selects on `device`: decode(q_nope, q_pe, kv_cache, block_table, context_lens,
    w_uk, w_uv, *, shape=K3_TP8, out=None) -> [B, H, v_head]."""
    device_type = torch.device(device).type
    backend = select_backend(config.mode, config.on_backend, device_type, torch.version.hip is not None,
                             aiter.is_available())
    if backend == "naive":
        return naive.decode
    if backend == "aiter":
        return aiter_decode
    default = split_kv.default_tiling(device_type)
    tiling = split_kv.Tiling(config.tile_tokens or default.tile_tokens, config.stage_bytes or default.stage_bytes)
    return functools.partial(split_kv.decode, tiling=tiling)
