"""The on paths: each mechanism as one inductor-compiled pass that reads each input once and writes each
output once, into `out=` buffers and states in place, with no intermediate tensors between stages.

The bodies are plain torch; `compiled` turns each into fused kernels (C++ loops on CPU, Triton on GPU).
"""

from __future__ import annotations

import functools

import torch

from opts.fusion.checks import check_attn_res, check_kda_decode, check_mla_norm
from opts.fusion.compiled import compiled
from opts.fusion.inputs import AttnResLayer, AttnResStep, KdaDecodeLayer, KdaDecodeStep, MlaNormLayer
from opts.fusion.naive import L2_NORM_EPS


def _mla_norm_body(qkv, q_weight, kv_weight, q_out, kv_out, q_rank: int, kv_rank: int, eps: float):
    q = qkv[:, :q_rank].float()
    kv = qkv[:, q_rank:q_rank + kv_rank].float()
    q_out.copy_(q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * q_weight.float())
    kv_out.copy_(kv * torch.rsqrt(kv.pow(2).mean(-1, keepdim=True) + eps) * kv_weight.float())


def mla_norm_fused(layer: MlaNormLayer, qkv_lora: torch.Tensor, q_out: torch.Tensor | None = None,
                   kv_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both RMSNorms in one pass over the q_a/kv_a projection output, into q_out and kv_out.

    Returns (q normed [N, q_lora], kv normed [N, kv_lora], k_pe view [N, rope]); the rope part is not read.
    """
    check_mla_norm(layer, qkv_lora, q_out, kv_out)
    n, q_rank, kv_rank = qkv_lora.shape[0], layer.q_lora_rank, layer.kv_lora_rank
    kw = {"dtype": qkv_lora.dtype, "device": qkv_lora.device}
    q_out = torch.empty(n, q_rank, **kw) if q_out is None else q_out
    kv_out = torch.empty(n, kv_rank, **kw) if kv_out is None else kv_out
    compiled(_mla_norm_body)(qkv_lora, layer.q_weight, layer.kv_weight, q_out, kv_out, q_rank, kv_rank, layer.eps)
    return q_out, kv_out, qkv_lora[:, q_rank + kv_rank:]


def _kda_decode_body(x, conv_state, conv_weight, raw_g, raw_beta, A_log, dt_bias, state, gate, norm_weight, out,
                     lower_bound: float | None, scale: float, eps: float):
    n = x.shape[0]
    heads, dim = A_log.shape[0], norm_weight.shape[0]
    width = conv_weight.shape[-1]
    y = x.float() * conv_weight[:, width - 1]
    for j in range(width - 1):
        y = y + conv_state[..., j].float() * conv_weight[:, j]
    y = torch.nn.functional.silu(y)
    conv_state.copy_(torch.cat([conv_state[..., 1:], x.unsqueeze(-1)], dim=-1))
    q, k, v = y.view(n, 3, heads, dim).unbind(1)
    q = q * (scale / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_NORM_EPS))
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2_NORM_EPS)
    g_in = raw_g.float() + dt_bias.view(heads, dim)
    a = A_log.float().exp().unsqueeze(-1)
    g = -a * torch.nn.functional.softplus(g_in) if lower_bound is None else lower_bound * torch.sigmoid(a * g_in)
    beta = torch.sigmoid(raw_beta.float()).unsqueeze(-1)
    decayed = state * g.exp().unsqueeze(-2)                       # [N, H, dv, dk]: rows are value channels
    u = beta * (v - (decayed * k.unsqueeze(-2)).sum(-1))
    o = (decayed * q.unsqueeze(-2)).sum(-1) + (q * k).sum(-1, keepdim=True) * u
    state.copy_(decayed + u.unsqueeze(-1) * k.unsqueeze(-2))
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    out.copy_(o * torch.sigmoid(gate.float()))


def kda_decode_fused(layer: KdaDecodeLayer, step: KdaDecodeStep, out: torch.Tensor) -> torch.Tensor:
    """Conv update, recurrent update and gated RMSNorm in one pass; out [N, H, D] written directly.

    The state update and both outputs come from one read of each state row: with S' = diag-decayed S plus
    k u^T, S'^T q = (decayed S)^T q + (k.q) u, so no second pass over the new state is needed.
    """
    check_kda_decode(layer, step, out)
    compiled(_kda_decode_body)(step.mixed_qkv, step.conv_state, layer.conv_weight, step.raw_g, step.raw_beta,
                               layer.A_log, layer.dt_bias, step.state, step.output_gate, layer.norm_weight, out,
                               layer.lower_bound, layer.qk_scale, layer.norm_eps)
    return out


def _attn_res_body(prefix, delta, blocks, norm_weight, proj_weight, out_weight, out,
                   num_blocks: int, write_idx: int, eps: float, out_eps: float):
    p = prefix.float()
    if delta is not None:
        p = (p + delta.float()).to(prefix.dtype)
        prefix.copy_(p)
        p = p.float()
    if write_idx >= 0:
        blocks[:, write_idx].copy_(p)
    mixed = p
    if num_blocks > 0:
        sources = [blocks[:, i].float() for i in range(num_blocks)] + [p]     # unrolled: no stacked copy
        query = norm_weight.float() * proj_weight.float()
        logits = [(s * query).sum(-1, keepdim=True) * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
                  for s in sources]
        top = functools.reduce(torch.maximum, logits)
        scores = [(logit - top).exp() for logit in logits]
        mixed = sum(score * s for score, s in zip(scores, sources, strict=True)) / sum(scores)
    out.copy_(mixed * torch.rsqrt(mixed.pow(2).mean(-1, keepdim=True) + out_eps) * out_weight.float())


def attn_res_fused(layer: AttnResLayer, step: AttnResStep, out: torch.Tensor | None = None) -> torch.Tensor:
    """The attention-residual step in one pass: delta add, block store, softmax mix and output RMSNorm.

    Returns out [T, hidden]; prefix and blocks are updated in place, as by `attn_res_unfused`.
    """
    check_attn_res(layer, step, out)
    out = torch.empty_like(step.prefix) if out is None else out
    compiled(_attn_res_body)(step.prefix, step.delta, step.blocks, layer.res_norm_weight, layer.res_proj_weight,
                             layer.out_norm_weight, out, step.num_blocks, step.block_write_idx, layer.eps,
                             layer.out_eps)
    return out
