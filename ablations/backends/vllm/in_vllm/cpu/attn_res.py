"""K3's attention residuals on CPU: `attn_res` (vllm/models/kimi_k3/nvidia/ops/attn_res.py:170-249) launches a
Triton kernel (`'function' object is not subscriptable` at :222). Same contract, in PyTorch (fp32 math):

    prefix += delta (rounded to prefix's dtype, in place); blocks[:, block_write_idx] = prefix (if >= 0)
    sources = blocks[:, :num_blocks] + [prefix];  logit_s = (v_s · (norm_w ⊙ qk_w)) / rms(v_s)
    mixed = Σ_s softmax(logit)_s v_s;  out = RMSNorm(mixed) · output_norm_w  (mixed itself when no output norm)

Tested against the kernel's semantics and the project's float64 reference (opts.fusion.reference).
"""

from __future__ import annotations

import torch

from opts.k3 import rms_norm_fp32


def attn_res(
    prefix: torch.Tensor,
    delta: torch.Tensor | None,
    blocks: torch.Tensor,
    norm_weight: torch.Tensor,
    qk_weight: torch.Tensor,
    output_norm_weight: torch.Tensor | None,
    num_blocks: int,
    block_write_idx: int,
    eps: float,
    output_norm_eps: float,
) -> torch.Tensor:
    """Returns the sub-layer input [T, hidden] in prefix's dtype; `prefix` and `blocks` are updated in place."""
    if delta is not None:
        prefix.copy_(prefix.float() + delta.float())
    current = prefix.float()
    if block_write_idx >= 0:
        blocks[:, block_write_idx] = prefix
    mixed = current
    if num_blocks > 0:
        sources = torch.cat([blocks[:, :num_blocks].float(), current.unsqueeze(1)], dim=1)  # [T, S, hidden]
        query = norm_weight.float() * qk_weight.float()
        logits = (sources @ query) * torch.rsqrt(sources.pow(2).mean(-1) + eps)
        mixed = (logits.softmax(-1).unsqueeze(-1) * sources).sum(1)
    if output_norm_weight is not None:
        mixed = rms_norm_fp32(mixed, output_norm_weight, output_norm_eps)
    return mixed.to(prefix.dtype)


RES_PROJ_NAMES = ("self_attention_res_proj", "mlp_res_proj", "output_attn_res_proj")


def keep_res_proj_weights(module) -> None:
    """After KimiDecoderLayer / KimiLinearModel init: AttnRes reads its learned queries' `.weight` directly,
    which the CPU GEMM packer would empty (model_executor/layers/linear.py:206-216), as for MLA's kv_b_proj."""
    for name in RES_PROJ_NAMES:
        proj = getattr(module, name, None)
        if proj is not None:
            proj._cpu_skip_gemm_dispatch = True
