"""The toggle as a transform: a config and a device in, the decode function that runs out."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from opts.aiter_mla import aiter, cpu_kernel, naive, split_kv
from opts.aiter_mla.config import AiterMLAConfig

BACKENDS = ("split_kv", "vllm_cpu", "aiter")
OFF_BACKEND = "split_kv"
Decode = Callable[..., torch.Tensor]

NO_VENDOR_KERNEL = ("aiter_mla: no vendor MLA decode for NVIDIA CUDA in this package (AITER is ROCm only; vLLM's "
                    "FlashMLA/CUTLASS/FlashInfer MLA are not wired here); only off (split_kv) runs there")


def vendor_backend(device_type: str, is_hip: bool) -> str | None:
    """The platform's vendor decode: "vllm_cpu" on the CPU, "aiter" on ROCm, None on NVIDIA CUDA."""
    if device_type == "cpu":
        return "vllm_cpu"
    if device_type == "cuda" and is_hip:
        return "aiter"
    return None


def select_backend(mode: str, on_backend: str, device_type: str, is_hip: bool) -> str:
    """Which decode runs: "split_kv" when off; when on, the platform's vendor decode (`vendor_backend`).
    On with no vendor decode on the platform, or one asked for that does not run there, is a ValueError."""
    if mode == "off":
        return OFF_BACKEND
    vendor = vendor_backend(device_type, is_hip)
    if on_backend == "auto":
        if vendor is None:
            raise ValueError(NO_VENDOR_KERNEL)
        return vendor
    if on_backend != vendor:
        where = {"vllm_cpu": "the CPU device", "aiter": "a ROCm GPU"}.get(on_backend)
        if where is None:
            raise ValueError(f"aiter_mla: on_backend {on_backend!r}; valid choices: auto, vllm_cpu, aiter")
        valid = f"auto, {vendor}" if vendor else "none, off only"
        raise ValueError(f"aiter_mla: on_backend={on_backend!r} runs on {where} only; here device={device_type!r}, "
                         f"ROCm={is_hip}; valid choices here: {valid}")
    return vendor


def missing(backend: str) -> str | None:
    """Why `backend` cannot run here (what to install; "unavailable": no vendor decode), or None when it can."""
    if backend == "unavailable":
        return NO_VENDOR_KERNEL
    if backend == "vllm_cpu" and not cpu_kernel.is_available():
        return ("aiter_mla: on (vllm_cpu) needs vllm-cpu installed (torch.ops._C.mla_decode_kvcache) with a CPU "
                "build of torch; not available here")
    if backend == "aiter" and not aiter.is_available():
        return "aiter_mla: on (aiter) needs amd-aiter installed; it is not importable here"
    return None


def off_tiling(config: AiterMLAConfig, device_type: str) -> split_kv.Tiling:
    """Off's split-KV tiling: the config's tile_tokens / stage_bytes, each 0 taking the device default."""
    default = split_kv.default_tiling(device_type)
    return split_kv.Tiling(config.tile_tokens or default.tile_tokens, config.stage_bytes or default.stage_bytes)


def make_decode(config: AiterMLAConfig, device: str | torch.device = "cpu") -> Decode:
    """The decode `config` selects on `device`: decode(q_nope, q_pe, kv_cache, block_table, context_lens,
    w_uk, w_uv, *, shape=K3_TP8, out=None) -> [B, H, v_head]."""
    device_type = torch.device(device).type
    backend = select_backend(config.mode, config.on_backend, device_type, torch.version.hip is not None)
    if backend == OFF_BACKEND:
        return functools.partial(naive.decode, tiling=off_tiling(config, device_type))
    reason = missing(backend)
    if reason:
        raise ValueError(reason)
    return cpu_kernel.decode if backend == "vllm_cpu" else aiter.decode
