"""The layer's parts every mode shares: K3's router, the routed experts in the latent, the shared-expert MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from opts.moe_dedup.weights import ExpertWeights, MlpWeights


def route(x: torch.Tensor, router: torch.Tensor, router_bias: torch.Tensor, top_k: int
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """K3's router on x [T, H]: scores sigmoid(x router^T), the top_k experts by score + bias, their scores
    renormalised to sum to one. Returns (ids [T, top_k] int64, weights [T, top_k] in x's dtype). The scores are
    float64 (vLLM: fp32) so that a near tie cannot pick other experts in a mode whose GEMM sees another batch
    size (sp routes each rank's chunk): the modes then differ only by rounding."""
    scores = torch.sigmoid(x.double() @ router.double().t())
    ids = torch.topk(scores + router_bias.double(), top_k, dim=-1).indices
    weights = scores.gather(-1, ids)
    return ids, (weights / weights.sum(-1, keepdim=True)).to(x.dtype)


def mlp(x: torch.Tensor, w: MlpWeights) -> torch.Tensor:
    """silu(x gate^T) * (x up^T), projected by down: [T, H] -> [T, H] (a partial sum when w holds a rank's part of
    the intermediate)."""
    return (F.silu(x @ w.gate.t()) * (x @ w.up.t())) @ w.down.t()


def routed_experts(latent: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, experts: ExpertWeights
                   ) -> torch.Tensor:
    """sum over a token's chosen experts held here of weight * expert(latent): [T, L] -> [T, L]. Experts held
    elsewhere contribute nothing; a rank holding part of every expert's intermediate returns a partial sum."""
    out = torch.zeros_like(latent)
    for local in range(experts.num_local):
        token, slot = torch.nonzero(ids == experts.first + local, as_tuple=True)
        if token.numel() == 0:
            continue
        x = latent.index_select(0, token)
        h = F.silu(x @ experts.gate[local].t()) * (x @ experts.up[local].t())
        out.index_add_(0, token, (h @ experts.down[local].t()) * weights[token, slot].unsqueeze(-1))
    return out
