"""The float64 references: the whole latent-MoE layer in one process (no ranks, every expert dense), and the tail
from the ranks' partials. Written apart from the ranks' code (dense gates, einsums) so a shared slip shows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from opts.k3 import rms_norm_f64
from opts.moe_dedup.shape import MoeShape
from opts.moe_dedup.weights import MoeWeights


def reference_gates(x: torch.Tensor, router: torch.Tensor, router_bias: torch.Tensor, top_k: int) -> torch.Tensor:
    """Dense routing weights [T, E] in float64: a token's top_k experts by sigmoid score + bias carry their
    scores renormalised to sum to one, the others zero."""
    scores = torch.sigmoid(x.double() @ router.double().t())
    order = torch.argsort(scores + router_bias.double(), dim=-1, descending=True)[:, :top_k]
    chosen = torch.zeros_like(scores).scatter_(-1, order, 1.0) * scores
    return chosen / chosen.sum(-1, keepdim=True)


def reference_layer(x: torch.Tensor, weights: MoeWeights, shape: MoeShape) -> torch.Tensor:
    """The layer on x [T, H] with the whole (unsplit) `weights`, in float64: [T, H]."""
    w = weights
    x = x.double()
    gates = reference_gates(x, w.router, w.router_bias, shape.top_k)
    latent = x @ w.down.double().t()
    ex = w.experts
    h = torch.nn.functional.silu(torch.einsum("tl,eil->tei", latent, ex.gate.double()))
    h = h * torch.einsum("tl,eil->tei", latent, ex.up.double())
    routed = torch.einsum("te,tei,eli->tl", gates, h, ex.down.double())
    sh = w.shared
    shared = (torch.nn.functional.silu(x @ sh.gate.double().t()) * (x @ sh.up.double().t())) @ sh.down.double().t()
    latent_out = rms_norm_f64(routed, w.norm, shape.norm_eps)
    return shape.routed_scaling_factor * latent_out @ w.up.double().t() + shared


def reference_tail(fused_partials: Sequence[torch.Tensor], shared_partials: Sequence[torch.Tensor],
                   norm_weight: torch.Tensor, up_weight: torch.Tensor, shape: MoeShape) -> torch.Tensor:
    """The tail from every rank's partials, in float64: s * rmsnorm(sum fused) up^T + sum shared, [T, H]."""
    fused = torch.stack([f.double() for f in fused_partials]).sum(0)
    shared = torch.stack([s.double() for s in shared_partials]).sum(0)
    return shape.routed_scaling_factor * rms_norm_f64(fused, norm_weight, shape.norm_eps) @ up_weight.double().t() \
        + shared
