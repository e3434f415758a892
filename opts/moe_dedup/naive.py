"""off: vLLM's replicated latent-MoE tail. Every tensor-parallel rank up-projects the whole hidden size."""

from __future__ import annotations

from collections.abc import Callable

import torch

Norm = Callable[[torch.Tensor], torch.Tensor]
AllReduce = Callable[[torch.Tensor], torch.Tensor]


def tail_off(fused_output: torch.Tensor, shared_output: torch.Tensor, *, norm: Norm, up_weight: torch.Tensor,
             all_reduce: AllReduce, routed_scaling_factor: float = 1.0) -> torch.Tensor:
    """The replicated tail (vLLM's `LatentMoERunner._overlap_allreduce_tail`, tier 1, and the base runner):
    latent = norm(all_reduce(fused_output)) [T, L]; out = s * latent up_weight^T + all_reduce(shared_output)
    [T, H], the same full result on every rank. `fused_output` is this rank's partial routed latent,
    `shared_output` its partial shared-expert output; `all_reduce` sums over the ranks and may write in place."""
    latent = norm(all_reduce(fused_output))
    routed = torch.mm(latent, up_weight.t())
    if routed_scaling_factor != 1.0:
        routed.mul_(routed_scaling_factor)
    return routed.add_(all_reduce(shared_output))
