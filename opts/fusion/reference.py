"""float64 ground truth of the three mechanisms, written from the math (README.md), not from either path."""

from __future__ import annotations

import torch

from opts.fusion.inputs import AttnResLayer, AttnResStep, KdaDecodeLayer, KdaDecodeStep, MlaNormLayer
from opts.k3 import l2_normalize, rms_norm_f64

f64 = torch.float64


def mla_norm_reference(layer: MlaNormLayer, qkv_lora: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(q_c) * q_weight, RMSNorm(kv_c) * kv_weight) in float64."""
    q_c = qkv_lora[:, :layer.q_lora_rank]
    kv_c = qkv_lora[:, layer.q_lora_rank:layer.q_lora_rank + layer.kv_lora_rank]
    return rms_norm_f64(q_c, layer.q_weight, layer.eps), rms_norm_f64(kv_c, layer.kv_weight, layer.eps)


def kda_decode_reference(layer: KdaDecodeLayer, step: KdaDecodeStep
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [N, H, D], new conv_state, new state [N, H, dv, dk]) in float64; the step is not modified.

    S~ = S diag(e^g), u = beta (v - S~ k), S' = S~ + u k^T, o = S' q (q, k L2-normalised, q scaled).
    """
    n, h, d = step.raw_g.shape
    window = torch.cat([step.conv_state.to(f64), step.mixed_qkv.to(f64).unsqueeze(-1)], dim=-1)
    y = (window * layer.conv_weight.to(f64)).sum(-1)
    y = y * torch.sigmoid(y)
    q, k, v = y.view(n, 3, h, d).unbind(1)
    q, k = l2_normalize(q) * layer.qk_scale, l2_normalize(k)
    x = step.raw_g.to(f64) + layer.dt_bias.to(f64).view(h, d)
    a = layer.A_log.to(f64).exp().unsqueeze(-1)
    g = -a * torch.log1p(torch.exp(x)) if layer.lower_bound is None else layer.lower_bound * torch.sigmoid(a * x)
    beta = torch.sigmoid(step.raw_beta.to(f64))
    decayed = step.state.to(f64) * g.exp().unsqueeze(-2)
    u = beta.unsqueeze(-1) * (v - torch.einsum("nhvk,nhk->nhv", decayed, k))
    state = decayed + torch.einsum("nhv,nhk->nhvk", u, k)
    o = torch.einsum("nhvk,nhk->nhv", state, q)
    out = rms_norm_f64(o, layer.norm_weight, layer.norm_eps) * torch.sigmoid(step.output_gate.to(f64))
    return out, window[..., 1:], state


def attn_res_reference(layer: AttnResLayer, step: AttnResStep
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [T, hidden], new prefix, new blocks) in float64; the step is not modified.

    out = RMSNorm(sum_s softmax_s(w . RMSNorm(v_s)) v_s) over the sources v_s = completed blocks + prefix,
    where w is the learned query (res_proj) and RMSNorm(v_s) carries the res_norm weight.
    """
    prefix = step.prefix.to(f64)
    if step.delta is not None:
        prefix = prefix + step.delta.to(f64)
    blocks = step.blocks.to(f64).clone()
    if step.block_write_idx >= 0:
        blocks[:, step.block_write_idx] = prefix
    sources = torch.cat([blocks[:, :step.num_blocks], prefix.unsqueeze(1)], dim=1)
    logits = rms_norm_f64(sources, layer.res_norm_weight, layer.eps) @ layer.res_proj_weight.to(f64)
    mixed = (logits.softmax(-1).unsqueeze(-1) * sources).sum(1)
    return rms_norm_f64(mixed, layer.out_norm_weight, layer.out_eps), prefix, blocks
