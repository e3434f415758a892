"""The latent-MoE layer's weights: built from a seed, split per rank (tensor parallel or expert parallel)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from opts.moe_dedup.shape import MoeShape


def _check(where: str, name: str, tensor: object, shape: tuple[int, ...], dtype: torch.dtype | None) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{where}.{name}: expected a tensor, got {type(tensor).__name__}")
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{where}.{name}: shape {tuple(tensor.shape)}; valid: {shape}")
    if dtype is not None and tensor.dtype != dtype:
        raise ValueError(f"{where}.{name}: dtype {tensor.dtype}; valid: {dtype} (the layer's dtype)")


@dataclass(frozen=True)
class ExpertWeights:
    """Routed experts `first .. first + num_local - 1`, each a SiLU-gated MLP in the latent: gate, up
    [num_local, intermediate, latent], down [num_local, latent, intermediate] (intermediate: this rank's part)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    first: int = 0

    def __post_init__(self) -> None:
        if self.gate.dim() != 3:
            raise ValueError(f"ExpertWeights.gate: shape {tuple(self.gate.shape)}; valid: [experts, intermediate, "
                             "latent]")
        e, i, latent = self.gate.shape
        _check("ExpertWeights", "up", self.up, (e, i, latent), self.gate.dtype)
        _check("ExpertWeights", "down", self.down, (e, latent, i), self.gate.dtype)
        if isinstance(self.first, bool) or not isinstance(self.first, int) or self.first < 0:
            raise ValueError(f"ExpertWeights.first: invalid value {self.first!r}; valid: an integer >= 0")

    @property
    def num_local(self) -> int:
        return self.gate.shape[0]


@dataclass(frozen=True)
class MlpWeights:
    """A SiLU-gated MLP: down(silu(x gate^T) * (x up^T)); gate, up [intermediate, hidden], down [hidden,
    intermediate] (intermediate: this rank's part)."""

    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor

    def __post_init__(self) -> None:
        if self.gate.dim() != 2:
            raise ValueError(f"MlpWeights.gate: shape {tuple(self.gate.shape)}; valid: [intermediate, hidden]")
        i, h = self.gate.shape
        _check("MlpWeights", "up", self.up, (i, h), self.gate.dtype)
        _check("MlpWeights", "down", self.down, (h, i), self.gate.dtype)


@dataclass(frozen=True)
class MoeWeights:
    """One rank's (or, unsplit, the whole) latent-MoE layer: router [E, H] and its score bias [E], the routed
    down-projection [L, H], latent RMSNorm weight [L], up-projection [H, L], routed experts, shared experts."""

    router: torch.Tensor
    router_bias: torch.Tensor
    down: torch.Tensor
    norm: torch.Tensor
    up: torch.Tensor
    experts: ExpertWeights
    shared: MlpWeights

    def __post_init__(self) -> None:
        if self.router.dim() != 2:
            raise ValueError(f"MoeWeights.router: shape {tuple(self.router.shape)}; valid: [experts, hidden]")
        e, h = self.router.shape
        dtype = self.router.dtype
        if self.down.dim() != 2:
            raise ValueError(f"MoeWeights.down: shape {tuple(self.down.shape)}; valid: [latent, hidden]")
        latent = self.down.shape[0]
        _check("MoeWeights", "router_bias", self.router_bias, (e,), dtype)
        _check("MoeWeights", "down", self.down, (latent, h), dtype)
        _check("MoeWeights", "norm", self.norm, (latent,), dtype)
        _check("MoeWeights", "up", self.up, (h, latent), dtype)
        if not isinstance(self.experts, ExpertWeights) or not isinstance(self.shared, MlpWeights):
            raise ValueError("MoeWeights.experts / shared: expected ExpertWeights and MlpWeights")
        ex = self.experts
        if ex.gate.shape[2] != latent or ex.gate.dtype != dtype or ex.first + ex.num_local > e:
            raise ValueError(f"MoeWeights.experts: experts {ex.first}..{ex.first + ex.num_local - 1} of latent "
                             f"{ex.gate.shape[2]} ({ex.gate.dtype}); valid: within the router's {e} experts, "
                             f"latent {latent}, {dtype}")
        if self.shared.gate.shape[1] != h or self.shared.gate.dtype != dtype:
            raise ValueError(f"MoeWeights.shared: hidden {self.shared.gate.shape[1]} ({self.shared.gate.dtype}); "
                             f"valid: {h} ({dtype})")

    @property
    def hidden(self) -> int:
        return self.router.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.router.dtype

    def to(self, device: torch.device | str) -> MoeWeights:
        """These weights on `device`."""
        ex, sh = self.experts, self.shared
        return MoeWeights(self.router.to(device), self.router_bias.to(device), self.down.to(device),
                          self.norm.to(device), self.up.to(device),
                          ExpertWeights(ex.gate.to(device), ex.up.to(device), ex.down.to(device), ex.first),
                          MlpWeights(sh.gate.to(device), sh.up.to(device), sh.down.to(device)))


def random_weights(shape: MoeShape, seed: int, dtype: torch.dtype = torch.float32) -> MoeWeights:
    """The whole layer's weights drawn from `seed`: each matrix N(0, 1/fan_in), the norm weight near 1, a small
    router bias, so activations stay of order one at any size."""
    gen = torch.Generator().manual_seed(seed)
    h, latent, e, i = shape.hidden, shape.latent, shape.num_experts, shape.moe_intermediate
    s = shape.shared_intermediate

    def draw(*size: int, fan_in: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen).div_(math.sqrt(fan_in)).to(dtype)

    router = draw(e, h, fan_in=h)
    router_bias = (torch.randn(e, generator=gen) * 0.1).to(dtype)
    down = draw(latent, h, fan_in=h)
    norm = (1 + 0.1 * torch.randn(latent, generator=gen)).to(dtype)
    up = draw(h, latent, fan_in=latent)
    experts = ExpertWeights(draw(e, i, latent, fan_in=latent), draw(e, i, latent, fan_in=latent),
                            draw(e, latent, i, fan_in=i))
    shared = MlpWeights(draw(s, h, fan_in=h), draw(s, h, fan_in=h), draw(h, s, fan_in=s))
    return MoeWeights(router, router_bias, down, norm, up, experts, shared)


def _part(x: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    size = x.shape[dim] // world_size
    return x.narrow(dim, rank * size, size).contiguous()


def _check_rank(rank: int, world_size: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: invalid value {rank!r}; valid: 0..{world_size - 1}")


def shard_tensor_parallel(weights: MoeWeights, shape: MoeShape, rank: int, world_size: int) -> MoeWeights:
    """Rank `rank`'s weights under tensor parallelism (off, on): router, down, norm and up replicated; every
    routed expert's and the shared MLP's intermediate split in `world_size` parts (vLLM's FusedMoE and
    RowParallelLinear layout), this rank's part copied."""
    shape.check_world_size(world_size)
    _check_rank(rank, world_size)
    ex, sh = weights.experts, weights.shared
    experts = ExpertWeights(_part(ex.gate, 1, rank, world_size), _part(ex.up, 1, rank, world_size),
                            _part(ex.down, 2, rank, world_size))
    shared = MlpWeights(_part(sh.gate, 0, rank, world_size), _part(sh.up, 0, rank, world_size),
                        _part(sh.down, 1, rank, world_size))
    return MoeWeights(weights.router, weights.router_bias, weights.down, weights.norm, weights.up, experts, shared)


def shard_expert_parallel(weights: MoeWeights, shape: MoeShape, rank: int, world_size: int) -> MoeWeights:
    """Rank `rank`'s weights under sequence parallelism with expert parallelism (sp): experts
    `rank * E/world_size ..` whole, everything else (shared MLP included) replicated."""
    shape.check_world_size(world_size, expert_parallel=True)
    _check_rank(rank, world_size)
    ex = weights.experts
    experts = ExpertWeights(_part(ex.gate, 0, rank, world_size), _part(ex.up, 0, rank, world_size),
                            _part(ex.down, 0, rank, world_size), first=rank * (shape.num_experts // world_size))
    return MoeWeights(weights.router, weights.router_bias, weights.down, weights.norm, weights.up, experts,
                      weights.shared)
