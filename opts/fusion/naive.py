"""The off paths: each mechanism as separate passes with intermediate tensors and copies.

These are the paths vLLM runs when no fused kernel applies, written with the same stages and the same
buffers: vLLM's native RMSNorm (`vllm.ir.ops.rms_norm`), `FusedRMSNormGated.forward_native`,
`causal_conv1d_update_torch`, the packed recurrent decode as torch ops, and the copies between them.
Nothing here is slowed on purpose: each stage uses the cheapest plain torch form (no full-size temporaries
where an in-place or batched op exists).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opts.fusion.checks import check_attn_res, check_kda_decode, check_mla_norm
from opts.fusion.inputs import AttnResLayer, AttnResStep, KdaDecodeLayer, KdaDecodeStep, MlaNormLayer

L2_NORM_EPS = 1e-6   # inside the square root, as K3's decode kernels normalise q and k


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim as vLLM's native implementation runs it, one torch op per stage."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    x = x.to(weight.dtype) * weight
    return x.to(orig_dtype)


def gated_rms_norm_native(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate), as `FusedRMSNormGated.forward_native` (activation "sigmoid")."""
    x_float = x.float()
    variance = x_float.pow(2).mean(dim=-1, keepdim=True)
    x_normed = x_float * torch.rsqrt(variance + eps)
    x_normed = x_normed * weight.float()
    out = x_normed * torch.sigmoid(gate.float())
    return out.to(x.dtype)


def mla_norm_unfused(layer: MlaNormLayer, qkv_lora: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the q_a/kv_a projection output and normalise q and kv with two separate RMSNorms.

    Returns (q normed [N, q_lora], kv normed [N, kv_lora], k_pe view [N, rope]).
    """
    check_mla_norm(layer, qkv_lora)
    q_c, kv_c, k_pe = qkv_lora.split([layer.q_lora_rank, layer.kv_lora_rank, layer.rope_dim], dim=-1)
    return rms_norm_native(q_c, layer.q_weight, layer.eps), rms_norm_native(kv_c, layer.kv_weight, layer.eps), k_pe


def kda_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None,
             lower_bound: float | None) -> torch.Tensor:
    """K3's per-channel log decay from the raw gate [..., H, D]: the safe gate lower_bound*sigmoid(e^A (x + b)),
    or -e^A softplus(x + b) without a lower bound (b = 0 when dt_bias is None). fp32."""
    heads, dim = raw_g.shape[-2:]
    x = raw_g.float() if dt_bias is None else raw_g.float() + dt_bias.float().view(heads, dim)
    a = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -a * F.softplus(x)
    return lower_bound * torch.sigmoid(a * x)


def causal_conv_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                       out: torch.Tensor) -> torch.Tensor:
    """One-token causal depthwise conv + SiLU (`causal_conv1d_update_torch`), rolling conv_state in place.

    x [N, C]; conv_state [N, C, W-1]; weight [C, W]; out [N, C] receives the result (vLLM's packed_conv_out).
    """
    state_len = conv_state.shape[-1]
    x_new = torch.cat([conv_state, x.unsqueeze(-1)], dim=-1).to(weight.dtype)
    conv_state.copy_(x_new[:, :, -state_len:])
    y = F.conv1d(x_new, weight.unsqueeze(1), None, padding=0, groups=x.shape[-1])
    out.copy_(F.silu(y).squeeze(-1))
    return out


def kda_recurrent_decode(layer: KdaDecodeLayer, conv_out: torch.Tensor, raw_g: torch.Tensor,
                         raw_beta: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One recurrent KDA step per request from the packed post-conv q|k|v [N, 3HD]; state [N, H, dv, dk] in place.

    Returns o [N, H, dv] in conv_out's dtype, as vLLM's packed decode kernel returns a new tensor.
    """
    n = conv_out.shape[0]
    heads, dim = layer.num_heads, layer.head_dim
    q, k, v = conv_out.float().view(n, 3, heads, dim).unbind(1)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_NORM_EPS) * layer.qk_scale
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2_NORM_EPS)
    g = kda_gate(raw_g, layer.A_log, layer.dt_bias, layer.lower_bound)
    beta = torch.sigmoid(raw_beta.float())
    state.mul_(g.exp().unsqueeze(-2))
    u = (v - torch.matmul(state, k.unsqueeze(-1)).squeeze(-1)) * beta.unsqueeze(-1)
    state.view(-1, dim, dim).baddbmm_(u.reshape(-1, dim, 1), k.reshape(-1, 1, dim))
    o = torch.matmul(state, q.unsqueeze(-1)).squeeze(-1)
    return o.to(conv_out.dtype)


def kda_decode_unfused(layer: KdaDecodeLayer, step: KdaDecodeStep, out: torch.Tensor) -> torch.Tensor:
    """vLLM's unfused KDA decode: conv update, recurrent update, copy into the output buffer, gated norm, copy.

    out [N, H, D] is the layer's core-attention output buffer; conv_state and state are updated in place.
    """
    check_kda_decode(layer, step, out)
    conv_out = torch.empty(step.mixed_qkv.shape, dtype=step.mixed_qkv.dtype, device=step.mixed_qkv.device)
    causal_conv_update(step.mixed_qkv, step.conv_state, layer.conv_weight, conv_out)
    o = kda_recurrent_decode(layer, conv_out, step.raw_g, step.raw_beta, step.state)
    out.copy_(o)
    out.copy_(gated_rms_norm_native(out, step.output_gate, layer.norm_weight, layer.norm_eps))
    return out


def attn_res_unfused(layer: AttnResLayer, step: AttnResStep) -> torch.Tensor:
    """K3's attention residual as separate passes: add the delta into the partial block, store the block,
    score every source (RMSNorm then the learned query), softmax, weighted sum, then the output RMSNorm.

    Returns the normalised sub-layer input [T, hidden]; prefix and blocks are updated in place.
    """
    check_attn_res(layer, step)
    prefix, blocks, num_blocks = step.prefix, step.blocks, step.num_blocks
    if step.delta is not None:
        prefix.add_(step.delta)
    if step.block_write_idx >= 0:
        blocks[:, step.block_write_idx].copy_(prefix)
    if num_blocks == 0:
        mixed = prefix
    else:
        sources = blocks[:, :num_blocks]
        query = layer.res_proj_weight.view(1, -1)
        block_logits = F.linear(rms_norm_native(sources, layer.res_norm_weight, layer.eps), query).squeeze(-1)
        prefix_logit = F.linear(rms_norm_native(prefix, layer.res_norm_weight, layer.eps), query)
        weights = torch.cat([block_logits, prefix_logit], dim=-1).float().softmax(dim=-1).to(prefix.dtype)
        mixed = torch.baddbmm((prefix * weights[:, num_blocks:]).unsqueeze(1), weights[:, None, :num_blocks],
                              sources).squeeze(1)
    return rms_norm_native(mixed, layer.out_norm_weight, layer.out_eps)
