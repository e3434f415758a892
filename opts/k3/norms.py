"""The norms K3's layers use. Each RMSNorm variant mirrors one vLLM form; they round differently."""

from __future__ import annotations

import torch

L2_NORM_EPS = 1e-6   # inside the square root, as K3's KDA kernels normalise q and k


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + L2_NORM_EPS) over the last dim, in x's dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_NORM_EPS)


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm (`vllm.ir.ops.rms_norm`, native): fp32 math, rounded to the weight's dtype before the
    weight multiply, returned in x's dtype."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x.to(weight.dtype) * weight).to(orig_dtype)


def rms_norm_fp32(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32 throughout, returned in fp32, as vLLM's fused Triton kernels compute it (K3's
    `fused_q_kv_rmsnorm`, the MTP input norms, attention residuals' output norm)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate) in fp32 (`FusedRMSNormGated.forward_native`, activation sigmoid)."""
    return rms_norm_fp32(x, weight, eps) * torch.sigmoid(gate.float())


def rms_norm_f64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight in float64: the references' RMSNorm."""
    x = x.to(torch.float64)
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)
