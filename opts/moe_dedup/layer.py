"""The latent-MoE layer on one rank, in each mode: router top-k, down-projection, routed experts, shared experts,
then the tail the mode picks (off: `naive.tail_off`, on: `sharded.tail_on`, tiered: either by token count,
sp: `sequence.layer_sp`)."""

from __future__ import annotations

import torch

from opts.k3 import rms_norm_native
from opts.moe_dedup.bench.ranks import Comm
from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.experts import mlp, route, routed_experts
from opts.moe_dedup.naive import Norm, tail_off
from opts.moe_dedup.sequence import layer_sp
from opts.moe_dedup.shape import MoeShape
from opts.moe_dedup.sharded import check_scaling, hidden_shard, tail_on
from opts.moe_dedup.weights import MoeWeights, random_weights, shard_expert_parallel, shard_tensor_parallel


def latent_norm(weight: torch.Tensor, eps: float) -> Norm:
    """The latent RMSNorm as vLLM's RMSNorm computes it (fp32 math)."""
    return lambda x: rms_norm_native(x, weight, eps)


def rank_weights(weights: MoeWeights, shape: MoeShape, config: MoeDedupConfig, rank: int, world_size: int
                 ) -> MoeWeights:
    """Rank `rank`'s part of the whole layer's `weights` for `config`'s mode: expert parallel for sp, tensor
    parallel otherwise."""
    if config.mode == "sp":
        return shard_expert_parallel(weights, shape, rank, world_size)
    return shard_tensor_parallel(weights, shape, rank, world_size)


def tail(fused_output: torch.Tensor, shared_output: torch.Tensor, *, weights: MoeWeights, shape: MoeShape,
         config: MoeDedupConfig, comm: Comm) -> torch.Tensor:
    """off's or on's tail (tiered: by the step's token count) on this rank's partials."""
    if config.mode == "sp":
        raise ValueError("mode 'sp': its tail takes other inputs; use sequence.tail_sp (or moe_layer)")
    norm = latent_norm(weights.norm, shape.norm_eps)
    if config.is_sharded(fused_output.shape[0]):
        return tail_on(fused_output, shared_output, norm=norm, up_weight=weights.up, all_reduce=comm.all_reduce,
                       rank=comm.rank, world_size=comm.world_size, routed_scaling_factor=shape.routed_scaling_factor)
    return tail_off(fused_output, shared_output, norm=norm, up_weight=weights.up, all_reduce=comm.all_reduce,
                    routed_scaling_factor=shape.routed_scaling_factor)


def moe_layer(x: torch.Tensor, weights: MoeWeights, shape: MoeShape, config: MoeDedupConfig, comm: Comm
              ) -> torch.Tensor:
    """The layer on x [T, H] (the same on every rank) with this rank's `weights` (`rank_weights`): [T, H], the
    same on every rank. A mode the shape or world size cannot run is a ValueError before any collective."""
    if not isinstance(config, MoeDedupConfig):
        raise ValueError(f"config: expected a MoeDedupConfig, got {type(config).__name__}")
    if x.dim() != 2 or x.shape[1] != shape.hidden:
        raise ValueError(f"x: shape {tuple(x.shape)}; valid: [tokens, {shape.hidden}]")
    if config.mode == "sp":
        shape.check_world_size(comm.world_size, expert_parallel=True)
        return layer_sp(x, weights, top_k=shape.top_k, norm=latent_norm(weights.norm, shape.norm_eps),
                        rank=comm.rank, world_size=comm.world_size, reduce_scatter=comm.reduce_scatter,
                        all_gather=comm.all_gather, routed_scaling_factor=shape.routed_scaling_factor)
    shape.check_world_size(comm.world_size)
    if config.is_sharded(x.shape[0]):
        hidden_shard(shape.hidden, comm.rank, comm.world_size)
        check_scaling(shape.routed_scaling_factor)
    ids, gates = route(x, weights.router, weights.router_bias, shape.top_k)
    fused = routed_experts(x @ weights.down.t(), ids, gates, weights.experts)
    return tail(fused, mlp(x, weights.shared), weights=weights, shape=shape, config=config, comm=comm)


def random_tokens(shape: MoeShape, num_tokens: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Layer input [num_tokens, hidden] drawn from `seed`, N(0, 1)."""
    return torch.randn(num_tokens, shape.hidden, generator=torch.Generator().manual_seed(seed)).to(dtype)


def layer_job(comm: Comm, shape: MoeShape, configs: list[MoeDedupConfig], num_tokens: int, weight_seed: int,
              token_seed: int, poison: bool = False) -> list[torch.Tensor]:
    """On every rank: the layer's weights from `weight_seed`, its input from `token_seed`, each config's output
    (the inputs fresh for each); with `poison`, collectives' fresh buffers start as NaN."""
    comm.poison = poison
    weights = random_weights(shape, weight_seed)
    x = random_tokens(shape, num_tokens, token_seed)
    outs = []
    for config in configs:
        mine = rank_weights(weights, shape, config, comm.rank, comm.world_size).to(comm.device)
        outs.append(moe_layer(x.clone().to(comm.device), mine, shape, config, comm).cpu())
    return outs
