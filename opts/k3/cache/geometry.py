"""The hybrid cache's geometry as vLLM 0.32 lays it out: block size, groups, bytes per pool block.

vLLM groups layers of one kind into KV-cache groups of equal size (`_get_kv_cache_groups_uniform_page_size`,
kv_cache_utils.py:1455-1500), pads the KDA state page up to the attention page and raises the attention
block until its page holds a state (`platforms/interface.py:1040-1125`). One pool block is one page in each
layer of a group; a cached block of B tokens takes one block per MLA group, a KDA state one per KDA group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opts.k3 import K3, K3_TINY, K3Spec

MLA_ALIGNMENT = 128   # hybrid MLA: the manager block is a multiple of 128 tokens (interface.py:1076-1081)
KERNEL_BLOCK = 16
# An attention-only model's block: 64 tokens, a block size FLASHINFER_MLA's kernel takes (`mla/flashinfer_mla.py:205`:
# 32 or 64) and AITER's MLA takes any (`mla/rocm_aiter_mla.py:359-362`); CUTLASS_MLA takes only 128.
ATTENTION_BLOCK = 64


@dataclass(frozen=True)
class CacheGeometry:
    """`block_size` tokens per block; `block_bytes` per pool block; a cached block of tokens takes
    `num_attn_groups` pool blocks, a KDA state `num_state_groups`. `state_bytes` (one request's KDA
    state, all layers, unpadded) and `latent_bytes_per_token` (all MLA layers) are what the data needs. A model
    without KDA layers has no state: `num_state_groups` and `state_bytes` 0."""

    name: str
    block_size: int
    block_bytes: int
    num_attn_groups: int
    num_state_groups: int
    state_bytes: int
    latent_bytes_per_token: int

    def __post_init__(self) -> None:
        for name in ("block_size", "block_bytes", "num_attn_groups", "num_state_groups", "state_bytes",
                     "latent_bytes_per_token"):
            value = getattr(self, name)
            low = 0 if name in ("num_state_groups", "state_bytes") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"CacheGeometry.{name}: invalid value {value!r}; valid: an integer >= {low}")
        if (self.num_state_groups == 0) != (self.state_bytes == 0):
            raise ValueError(f"CacheGeometry: num_state_groups {self.num_state_groups} and state_bytes "
                             f"{self.state_bytes}: both 0 (no state) or both >= 1")

    def num_blocks(self, capacity_bytes: float) -> int:
        """Pool blocks that fit in `capacity_bytes` (a positive number of bytes)."""
        if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int | float) or not (
                capacity_bytes > 0 and math.isfinite(capacity_bytes)):
            raise ValueError(f"capacity_bytes: invalid value {capacity_bytes!r}; valid: bytes > 0")
        return int(capacity_bytes // self.block_bytes)


def group_layout(num_state_layers: int, num_attn_layers: int) -> tuple[int, int, int]:
    """(layers per group, state groups, attention groups), vLLM's rule for two layer kinds."""
    low, high = sorted((num_state_layers, num_attn_layers))
    group = high if high < low * 1.5 else low
    return group, -(-num_state_layers // group), -(-num_attn_layers // group)


def k3_geometry(spec: K3Spec = K3, *, tp: int = 8, kv_bytes: int = 2, conv_bytes: int = 2,
                num_spec_tokens: int = 0) -> CacheGeometry:
    """The geometry vLLM gives `spec` at tensor parallelism `tp`: latent cache replicated per rank in `kv_bytes`
    per element, KDA conv state in `conv_bytes`, recurrent state fp32 (the AMD layer ignores the SSM dtype)."""
    heads = spec.kda_heads_per_rank(tp)
    conv = 3 * heads * spec.kda_head_dim * (spec.conv_width - 1 + num_spec_tokens) * conv_bytes
    recurrent = heads * spec.kda_head_dim * spec.kda_head_dim * 4
    state_page = conv + recurrent
    token_page = spec.latent_dim * kv_bytes
    align = max(KERNEL_BLOCK, MLA_ALIGNMENT)
    block_size = align * -(-state_page // (align * token_page))
    group, state_groups, attn_groups = group_layout(spec.num_kda_layers, spec.num_mla_layers)
    return CacheGeometry(
        name=f"{spec.name}/tp{tp}", block_size=block_size, block_bytes=block_size * token_page * group,
        num_attn_groups=attn_groups, num_state_groups=state_groups, state_bytes=state_page * spec.num_kda_layers,
        latent_bytes_per_token=token_page * spec.num_mla_layers)


def attention_geometry(spec: K3Spec, *, tp: int = 8, kv_bytes: int = 2,
                       block_size: int = ATTENTION_BLOCK) -> CacheGeometry:
    """The geometry of a model whose every layer is MLA (`spec.num_kda_layers` 0): one group of all its layers,
    `block_size` tokens a block, the latent cache replicated per rank in `kv_bytes` per element, no state."""
    if spec.num_kda_layers:
        raise ValueError(f"attention_geometry: {spec.name} has {spec.num_kda_layers} KDA layers; use k3_geometry")
    token_page = spec.latent_dim * kv_bytes
    return CacheGeometry(
        name=f"{spec.name}/tp{tp}", block_size=block_size, block_bytes=block_size * token_page * spec.num_mla_layers,
        num_attn_groups=1, num_state_groups=0, state_bytes=0, latent_bytes_per_token=token_page * spec.num_mla_layers)


def geometry(spec: K3Spec, *, tp: int = 8, kv_bytes: int = 2, conv_bytes: int = 2,
             num_spec_tokens: int = 0) -> CacheGeometry:
    """The geometry vLLM gives `spec`: hybrid (`k3_geometry`) with KDA layers, else attention only."""
    if spec.num_kda_layers:
        return k3_geometry(spec, tp=tp, kv_bytes=kv_bytes, conv_bytes=conv_bytes, num_spec_tokens=num_spec_tokens)
    return attention_geometry(spec, tp=tp, kv_bytes=kv_bytes)


K3_TP8 = k3_geometry(K3)
TINY = k3_geometry(K3_TINY, tp=1, kv_bytes=4, conv_bytes=4)
