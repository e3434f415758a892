"""Validated shapes of the three fused mechanisms, with Kimi K3's per-rank sizes (TP=8) as defaults."""

from __future__ import annotations

from dataclasses import dataclass

from opts.k3 import K3


def _check_positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{owner}.{name}: invalid value {value!r}; valid: an integer >= 1")


@dataclass(frozen=True)
class KdaDecodeShape:
    """One KDA decode step: `num_tokens` requests, one token each. K3 at TP=8: 12 heads x 128, conv width 4."""

    num_tokens: int
    num_heads: int = K3.kda_heads_per_rank()
    head_dim: int = K3.kda_head_dim
    conv_width: int = K3.conv_width

    def __post_init__(self) -> None:
        _check_positive("KdaDecodeShape", num_tokens=self.num_tokens, num_heads=self.num_heads,
                        head_dim=self.head_dim)
        if not isinstance(self.conv_width, int) or self.conv_width < 2:
            raise ValueError(f"KdaDecodeShape.conv_width: invalid value {self.conv_width!r}; valid: an integer >= 2")

    @property
    def channels(self) -> int:
        """Conv channels: q, k and v, each heads x head_dim."""
        return 3 * self.num_heads * self.head_dim

    @property
    def projection_width(self) -> int:
        """Row width of the in_proj output the step's activations are views of: q|k|v, output gate, f_a, beta."""
        return self.channels + self.num_heads * self.head_dim + self.head_dim + self.num_heads

    @property
    def gate_offset(self) -> int:
        """Where the output gate starts in a projection row."""
        return self.channels

    @property
    def beta_offset(self) -> int:
        """Where the beta logits start in a projection row."""
        return self.channels + self.num_heads * self.head_dim + self.head_dim


@dataclass(frozen=True)
class MlaNormShape:
    """The MLA q/kv latents: the fused q_a/kv_a projection gives [tokens, q_lora + kv_lora + rope]."""

    num_tokens: int
    q_lora_rank: int = K3.q_lora_rank
    kv_lora_rank: int = K3.kv_lora_rank
    rope_dim: int = K3.rope_dim

    def __post_init__(self) -> None:
        _check_positive("MlaNormShape", num_tokens=self.num_tokens, q_lora_rank=self.q_lora_rank,
                        kv_lora_rank=self.kv_lora_rank)
        if not isinstance(self.rope_dim, int) or self.rope_dim < 0:
            raise ValueError(f"MlaNormShape.rope_dim: invalid value {self.rope_dim!r}; valid: an integer >= 0")

    @property
    def width(self) -> int:
        """Row width of the projection output."""
        return self.q_lora_rank + self.kv_lora_rank + self.rope_dim


@dataclass(frozen=True)
class AttnResShape:
    """One attention-residual step: mix `num_blocks` completed block states and the current partial block.

    `max_blocks` is the block buffer's size (K3: cdiv(93 layers, 12) = 8). `has_delta`: the latest sub-layer
    output is added into the partial block first; `block_write`: the updated partial block is stored as
    block `num_blocks` (the first layer of a block).
    """

    num_tokens: int
    num_blocks: int
    hidden: int = K3.hidden
    max_blocks: int = K3.num_res_blocks
    has_delta: bool = True
    block_write: bool = False

    def __post_init__(self) -> None:
        _check_positive("AttnResShape", num_tokens=self.num_tokens, hidden=self.hidden, max_blocks=self.max_blocks)
        top = self.max_blocks - (1 if self.block_write else 0)
        if not isinstance(self.num_blocks, int) or not 0 <= self.num_blocks <= top:
            raise ValueError(f"AttnResShape.num_blocks: invalid value {self.num_blocks!r}; valid: 0..{top} "
                             f"(max_blocks={self.max_blocks}, block_write={self.block_write})")

    @property
    def num_sources(self) -> int:
        """Mixed states: the completed blocks plus the partial block."""
        return self.num_blocks + 1

    @property
    def block_write_idx(self) -> int:
        """Where the partial block is stored, or -1."""
        return self.num_blocks if self.block_write else -1
