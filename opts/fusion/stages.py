"""The math of each stage, as plain torch functions of tensors: traced into one compiled pass per stage by
`naive.py` (off) and into one compiled pass per mechanism by `passes.py` (on), so off and on differ only in
where the stages meet (a tensor in memory, or nothing). K3's norms and gate come from `opts.k3`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from opts.k3 import L2_NORM_EPS, kda_gate, l2_normalize


def conv_silu(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One token of the depthwise causal conv over the window (conv_state, x), then SiLU: fp32 [N, C]."""
    width = weight.shape[-1]
    y = x.float() * weight[:, width - 1]
    for j in range(width - 1):
        y = y + conv_state[..., j].float() * weight[:, j]
    return F.silu(y)


def rolled(conv_state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The conv window after the step: the oldest token dropped, x appended."""
    return torch.cat([conv_state[..., 1:], x.unsqueeze(-1)], dim=-1)


def kda_recurrence(qkv: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor,
                   dt_bias: torch.Tensor, state: torch.Tensor, lower_bound: float | None,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrent KDA step from the post-conv q|k|v [N, 3HD]: (o [N, H, dv] fp32, new state [N, H, dv, dk]).

    o = S' q = (decayed S) q + (k.q) u, so o and the new state come from one read of each state row.
    """
    n = qkv.shape[0]
    heads, dim = A_log.shape[0], state.shape[-1]
    q, k, v = qkv.float().view(n, 3, heads, dim).unbind(1)
    q = q * (scale / torch.sqrt((q * q).sum(-1, keepdim=True) + L2_NORM_EPS))
    k = l2_normalize(k)
    g = kda_gate(raw_g, A_log, dt_bias, lower_bound)
    beta = torch.sigmoid(raw_beta.float()).unsqueeze(-1)
    decayed = state * g.exp().unsqueeze(-2)
    u = beta * (v - (decayed * k.unsqueeze(-2)).sum(-1))
    o = (decayed * q.unsqueeze(-2)).sum(-1) + (q * k).sum(-1, keepdim=True) * u
    return o, decayed + u.unsqueeze(-1) * k.unsqueeze(-2)


def attn_res_mix(prefix: torch.Tensor, delta: torch.Tensor | None, blocks: torch.Tensor, norm_weight: torch.Tensor,
                 proj_weight: torch.Tensor, num_blocks: int, write_idx: int, eps: float) -> torch.Tensor:
    """Delta add and block store (in place), then the softmax mix of the sources: fp32 [T, hidden]."""
    p = prefix.float()
    if delta is not None:
        p = (p + delta.float()).to(prefix.dtype)
        prefix.copy_(p)
        p = p.float()
    if write_idx >= 0:
        blocks[:, write_idx].copy_(p)
    if num_blocks == 0:
        return p
    sources = [blocks[:, i].float() for i in range(num_blocks)] + [p]
    query = norm_weight.float() * proj_weight.float()
    logits = [(s * query).sum(-1, keepdim=True) * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
              for s in sources]
    top = functools.reduce(torch.maximum, logits)
    scores = [(logit - top).exp() for logit in logits]
    return sum(score * s for score, s in zip(scores, sources, strict=True)) / sum(scores)
