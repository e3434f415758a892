"""sp: sequence-parallel MoE with expert parallelism (vLLM's NVIDIA K3 path, all2all backend
`allgather_reducescatter`). Each rank takes ceil(T/W) of the tokens (the last rank's chunk zero-padded), routes
and down-projects them; the routed latents are all-gathered, each rank runs its E/W whole experts over every
rank's tokens, a reduce-scatter sums the expert outputs back to the tokens' ranks; then the latent norm, the full
up-projection and the full shared MLP on the rank's own tokens only, and an all-gather of the outputs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from opts.moe_dedup.experts import mlp, route, routed_experts
from opts.moe_dedup.naive import Norm
from opts.moe_dedup.weights import MoeWeights

Collective = Callable[[torch.Tensor], torch.Tensor]


def token_chunk(num_tokens: int, world_size: int) -> int:
    """Tokens per rank: ceil(num_tokens / world_size)."""
    return -(-num_tokens // world_size)


def own_tokens(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank `rank`'s rows of x [T, ...]: [chunk, ...], zero rows past T."""
    chunk = token_chunk(x.shape[0], world_size)
    mine = x[rank * chunk:(rank + 1) * chunk]
    if mine.shape[0] == chunk:
        return mine
    return torch.cat([mine, mine.new_zeros(chunk - mine.shape[0], *x.shape[1:])])


def tail_sp(fused_output: torch.Tensor, shared_output: torch.Tensor, *, norm: Norm, up_weight: torch.Tensor,
            reduce_scatter: Collective, all_gather: Collective, num_tokens: int,
            routed_scaling_factor: float = 1.0) -> torch.Tensor:
    """fused_output [W chunk, L]: this rank's experts' output for every rank's tokens; shared_output [chunk, H]:
    the shared MLP on this rank's tokens. latent = norm(reduce_scatter(fused_output)) [chunk, L];
    all_gather(s * latent up_weight^T + shared_output)[:num_tokens] [T, H]."""
    latent = norm(reduce_scatter(fused_output))
    routed = torch.mm(latent, up_weight.t())
    if routed_scaling_factor != 1.0:
        routed.mul_(routed_scaling_factor)
    return all_gather(routed.add_(shared_output))[:num_tokens]


def layer_sp(x: torch.Tensor, weights: MoeWeights, *, top_k: int, norm: Norm, rank: int, world_size: int,
             reduce_scatter: Collective, all_gather: Collective, routed_scaling_factor: float = 1.0
             ) -> torch.Tensor:
    """The whole layer on x [T, H] (every rank holds all T tokens, as off and on do), sequence parallel:
    `weights` is this rank's expert-parallel shard (`weights.shard_expert_parallel`). Returns [T, H] on every rank."""
    mine = own_tokens(x, rank, world_size)
    ids, gates = route(mine, weights.router, weights.router_bias, top_k)
    latent = mine @ weights.down.t()
    fused = routed_experts(all_gather(latent), all_gather(ids), all_gather(gates), weights.experts)
    shared = mlp(mine, weights.shared)
    return tail_sp(fused, shared, norm=norm, up_weight=weights.up, reduce_scatter=reduce_scatter,
                   all_gather=all_gather, num_tokens=x.shape[0], routed_scaling_factor=routed_scaling_factor)
