"""on: vLLM's sharded latent-MoE tail (`ROCmLatentMoERunner._shard_up_proj_tail`, NVIDIA's tier 2). Each rank
up-projects only its 1/world_size of the hidden columns, into its shared-expert partial, before the one final
all-reduce: the same two collectives as off, 1/world_size of off's up-projection FLOPs."""

from __future__ import annotations

import torch

from opts.moe_dedup.naive import AllReduce, Norm


def hidden_shard(hidden: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, size) of rank `rank`'s hidden columns; a world size not dividing `hidden` is a ValueError."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1 or hidden % world_size:
        raise ValueError(f"world_size: invalid value {world_size!r}; the sharded tail splits the hidden size "
                         f"({hidden}) evenly, so valid: an integer >= 1 dividing {hidden}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: invalid value {rank!r}; valid: 0..{world_size - 1}")
    size = hidden // world_size
    return rank * size, size


def check_scaling(routed_scaling_factor: float) -> None:
    """The sharded tail adds the routed output into the shared partial unscaled: a routed_scaling_factor other
    than 1 is a ValueError (vLLM's ROCm runner falls back to the replicated tail then)."""
    if routed_scaling_factor != 1.0:
        raise ValueError(f"routed_scaling_factor: invalid value {routed_scaling_factor!r} for the sharded tail (on); "
                         "valid: 1.0, since on adds the routed up-projection into the shared partial unscaled "
                         "(use off, which scales it)")


def tail_on(fused_output: torch.Tensor, shared_output: torch.Tensor, *, norm: Norm, up_weight: torch.Tensor,
            all_reduce: AllReduce, rank: int, world_size: int, routed_scaling_factor: float = 1.0) -> torch.Tensor:
    """latent = norm(all_reduce(fused_output)) [T, L]; columns [r H/W, (r+1) H/W) of `shared_output` [T, H] (this
    rank's partial, written in place) += latent up_weight[r H/W : (r+1) H/W]^T; returns all_reduce(shared_output):
    off's result, as each column's routed part is added by exactly one rank."""
    check_scaling(routed_scaling_factor)
    hidden = up_weight.shape[0]
    if shared_output.shape[-1] != hidden:
        raise ValueError(f"shared_output: last dim {shared_output.shape[-1]}; valid: the up-projection's hidden "
                         f"size {hidden}")
    start, size = hidden_shard(hidden, rank, world_size)
    latent = norm(all_reduce(fused_output))
    shared_output.narrow(-1, start, size).addmm_(latent, up_weight.narrow(0, start, size).t())
    return all_reduce(shared_output)
