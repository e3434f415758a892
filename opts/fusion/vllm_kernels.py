"""vLLM-CPU's own kernels, where vLLM 0.32 on CPU has one for a stage the off path runs.

Only the short conv update has one: `causal_conv1d_update` is `causal_conv1d_update_cpu` on CPU
(vllm/model_executor/layers/mamba/ops/causal_conv1d.py), which calls `torch.ops._C.causal_conv1d_update_cpu_vec`.
RMSNorm has none on CPU: `vllm.ir.ops.rms_norm`'s `vllm_c` implementation is registered for GPUs only
(vllm/kernels/vllm_c.py, supported=GPGPU_DEVICE), so vLLM-CPU runs the native torch ops.
"""

from __future__ import annotations

import functools

import torch

from opts.vllm_import import hide_media_wheels


@functools.cache
def has_vllm_conv() -> bool:
    """Whether vLLM-CPU's conv update kernel can be called in this process (importing vLLM registers it)."""
    hide_media_wheels()
    try:
        import vllm._custom_ops  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        return False
    return hasattr(torch.ops, "_C") and hasattr(torch.ops._C, "causal_conv1d_update_cpu_vec")


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """vLLM-CPU's conv update with SiLU on a dense state batch (no slot is padding): a new [N, C] tensor in
    x's dtype; conv_state [N, C, W-1] rolled in place. The op's schema marks x as written; it is only read."""
    if not has_vllm_conv():
        raise RuntimeError("vLLM-CPU's causal_conv1d_update_cpu_vec is not available here (vllm not importable)")
    return torch.ops._C.causal_conv1d_update_cpu_vec(x, conv_state, weight, None, "silu", None, None, -1)
