"""The latent-MoE layer's sizes (K3's, a bench cut of them, a test size) and which world sizes can split them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from opts.k3 import K3, K3Spec

NORM_EPS = 1e-6


@dataclass(frozen=True)
class MoeShape:
    """One latent-MoE layer: `num_experts` routed SiLU-gated experts (intermediate `moe_intermediate`) in a
    `latent`-wide space between a `hidden`->`latent` down- and a `latent`->`hidden` up-projection, `top_k` per
    token; `num_shared_experts` shared experts as one hidden-wide MLP of intermediate
    `num_shared_experts * moe_intermediate`. The routed output is scaled by `routed_scaling_factor`."""

    hidden: int
    latent: int
    num_experts: int
    top_k: int
    moe_intermediate: int
    num_shared_experts: int
    routed_scaling_factor: float = 1.0
    norm_eps: float = NORM_EPS

    def __post_init__(self) -> None:
        for name in ("hidden", "latent", "num_experts", "top_k", "moe_intermediate", "num_shared_experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MoeShape.{name}: invalid value {value!r}; valid: an integer >= 1")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoeShape.top_k: invalid value {self.top_k!r}; valid: 1..num_experts "
                             f"({self.num_experts})")
        for name in ("routed_scaling_factor", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"MoeShape.{name}: invalid value {value!r}; valid: a finite number > 0")

    @property
    def shared_intermediate(self) -> int:
        return self.num_shared_experts * self.moe_intermediate

    def check_world_size(self, world_size: int, *, split_hidden: bool = False, expert_parallel: bool = False) -> int:
        """`world_size` if the layer splits over it (the expert and shared intermediates; with `split_hidden` the
        hidden size, with `expert_parallel` the experts), else a ValueError naming what it does not divide."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size: invalid value {world_size!r}; valid: an integer >= 1")
        sizes = {"moe_intermediate": self.moe_intermediate}
        if split_hidden:
            sizes["hidden"] = self.hidden
        if expert_parallel:
            sizes["num_experts"] = self.num_experts
        for name, size in sizes.items():
            if size % world_size:
                divisors = [d for d in range(1, size + 1) if size % d == 0 and d <= 64]
                raise ValueError(f"world_size: invalid value {world_size}; it must divide {name} ({size}); "
                                 f"valid: one of {divisors}")
        return world_size


def moe_shape(spec: K3Spec, **changes: object) -> MoeShape:
    """The MoE layer of a K3-family spec, with `changes` (e.g. num_experts=16) applied."""
    shape = MoeShape(hidden=spec.hidden, latent=spec.expert_latent, num_experts=spec.num_experts,
                     top_k=spec.experts_per_token, moe_intermediate=spec.moe_intermediate,
                     num_shared_experts=spec.num_shared_experts)
    return dataclasses.replace(shape, **changes)


K3_MOE = moe_shape(K3)
# The layer bench's cut: 896 experts -> 16 and top-16 -> 2, so a token's routed-expert FLOPs are 1/8 of K3's;
# hidden, latent, expert intermediate and the shared experts stay K3's.
K3_MOE_BENCH = moe_shape(K3, num_experts=16, top_k=2)
TEST_SHAPE = MoeShape(hidden=256, latent=128, num_experts=8, top_k=2, moe_intermediate=64, num_shared_experts=2)
