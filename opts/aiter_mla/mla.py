"""K3's MLA decode shapes and the parts every decode path shares: input checks, W_UK absorption, W_UV."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from opts.k3 import K3, TP, K3Spec
from opts.k3.spec import mla_latent_dim, mla_softmax_scale


@dataclass(frozen=True)
class MLAShape:
    """Per-rank MLA sizes. The default is Kimi K3 at TP=8: 96 heads / 8 ranks = 12."""

    num_heads: int = K3.mla_heads_per_rank()
    kv_lora_rank: int = K3.kv_lora_rank
    rope_dim: int = K3.rope_dim
    qk_nope_dim: int = K3.qk_nope_dim
    v_head_dim: int = K3.v_head_dim

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MLAShape.{f.name}: invalid value {value!r}; must be a positive int")

    @property
    def latent_dim(self) -> int:
        return mla_latent_dim(self.kv_lora_rank, self.rope_dim)

    @property
    def softmax_scale(self) -> float:
        return mla_softmax_scale(self.qk_nope_dim, self.rope_dim)

    @classmethod
    def per_rank(cls, spec: K3Spec, tp: int = TP) -> MLAShape:
        """One tensor-parallel rank's MLA sizes of `spec` (the latent cache is replicated, heads are split)."""
        return cls(spec.mla_heads_per_rank(tp), spec.kv_lora_rank, spec.rope_dim, spec.qk_nope_dim, spec.v_head_dim)


K3_TP8 = MLAShape.per_rank(K3, 8)


def _expect(name: str, tensor: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    ok = tensor.dim() == len(shape) and all(s is None or s == t for s, t in zip(shape, tensor.shape, strict=True))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: shape {list(tensor.shape)} does not match the expected {want}")


def check_inputs(shape: MLAShape, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                 block_table: torch.Tensor, context_lens: torch.Tensor, w_uk: torch.Tensor,
                 w_uv: torch.Tensor, out: torch.Tensor | None) -> None:
    """Shapes and dtypes of one decode call; errors name the argument, its shape and the expected one.

    q_nope [B, H, qk_nope], q_pe [B, H, rope], kv_cache [num_blocks, block_size, latent],
    block_table [B, max_blocks] (integer), context_lens [B] (integer), w_uk [H, qk_nope, kv_lora],
    w_uv [H, v_head, kv_lora], out [B, H, v_head].
    """
    batch, heads = q_nope.shape[0], shape.num_heads
    _expect("q_nope", q_nope, (batch, heads, shape.qk_nope_dim))
    _expect("q_pe", q_pe, (batch, heads, shape.rope_dim))
    _expect("kv_cache", kv_cache, (None, None, shape.latent_dim))
    _expect("block_table", block_table, (batch, None))
    _expect("context_lens", context_lens, (batch,))
    _expect("w_uk", w_uk, (heads, shape.qk_nope_dim, shape.kv_lora_rank))
    _expect("w_uv", w_uv, (heads, shape.v_head_dim, shape.kv_lora_rank))
    if out is not None:
        _expect("out", out, (batch, heads, shape.v_head_dim))
    dtype = kv_cache.dtype
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("w_uk", w_uk), ("w_uv", w_uv), ("out", out)):
        if t is not None and t.dtype != dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from kv_cache's {dtype}")
    if not dtype.is_floating_point:
        raise ValueError(f"kv_cache: dtype {dtype} is not a floating-point type")
    for name, t in (("block_table", block_table), ("context_lens", context_lens)):
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name}: dtype {t.dtype} is not an integer type")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (the paged pool is read in place)")


def check_latent_inputs(q_latent: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                        context_lens: torch.Tensor, kv_lora_rank: int) -> None:
    """Shapes and dtypes of one latent attention call (W_UK already absorbed into the query):
    q_latent [B, H, latent], kv_cache [num_blocks, block_size, latent] (contiguous, q's dtype),
    block_table [B, max_blocks] and context_lens [B] (integer), 0 < kv_lora_rank < latent."""
    if q_latent.dim() != 3:
        raise ValueError(f"q_latent: shape {list(q_latent.shape)} does not match the expected [*, *, *]")
    batch, latent = q_latent.shape[0], q_latent.shape[2]
    _expect("kv_cache", kv_cache, (None, None, latent))
    _expect("block_table", block_table, (batch, None))
    _expect("context_lens", context_lens, (batch,))
    if kv_cache.dtype != q_latent.dtype:
        raise ValueError(f"q_latent: dtype {q_latent.dtype} differs from kv_cache's {kv_cache.dtype}")
    if not 0 < kv_lora_rank < latent:
        raise ValueError(f"kv_lora_rank: invalid value {kv_lora_rank}; must be in (0, {latent}), the latent width")
    for name, t in (("block_table", block_table), ("context_lens", context_lens)):
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"{name}: dtype {t.dtype} is not an integer type")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: must be contiguous (the paged pool is read in place)")


def check_lengths(context_lens: list[int], table_width: int, block_size: int) -> None:
    """Every context length is at least 1 and fits its block-table row."""
    max_tokens = table_width * block_size
    for b, length in enumerate(context_lens):
        if not 1 <= length <= max_tokens:
            raise ValueError(f"context_lens[{b}]: invalid value {length}; must be in [1, {max_tokens}] "
                             f"(block_table width {table_width} x block_size {block_size})")


def check_block_ids(ids: torch.Tensor, num_blocks: int) -> None:
    """The block ids a decode reads all exist in the pool."""
    lo, hi = (int(x) for x in torch.aminmax(ids))
    if lo < 0 or hi >= num_blocks:
        bad = lo if lo < 0 else hi
        raise ValueError(f"block_table: block id {bad} used by a context is outside the pool [0, {num_blocks})")


def check_context(context_lens: list[int], block_table: torch.Tensor, num_blocks: int, block_size: int) -> None:
    """Context lengths fit their block-table rows, and the block ids they use exist in the pool."""
    check_lengths(context_lens, block_table.shape[1], block_size)
    blocks = torch.tensor([-(-n // block_size) for n in context_lens], device=block_table.device)
    used = torch.arange(block_table.shape[1], device=block_table.device) < blocks[:, None]
    check_block_ids(block_table[used], num_blocks)


def absorb_query(q_nope: torch.Tensor, q_pe: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """Fold W_UK into the query: [B, H, qk_nope] x [H, qk_nope, kv_lora] -> q_latent [B, H, kv_lora + rope]."""
    q_c = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)
    return torch.cat([q_c, q_pe], dim=-1)


def up_project(o_latent: torch.Tensor, w_uv: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Apply W_UV after attention: [B, H, kv_lora] x [H, v_head, kv_lora]^T -> [B, H, v_head], into `out`."""
    o = torch.bmm(o_latent.to(w_uv.dtype).transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)
    if out is None:
        return o.contiguous()
    out.copy_(o)
    return out


def absorbed_decode(latent_attention: Callable[[torch.Tensor, list[int]], torch.Tensor], q_nope: torch.Tensor,
                    q_pe: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                    context_lens: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, shape: MLAShape,
                    out: torch.Tensor | None) -> torch.Tensor:
    """Check the inputs, fold W_UK into q, run `latent_attention(q_latent, lens)`, apply W_UV into `out`."""
    check_inputs(shape, q_nope, q_pe, kv_cache, block_table, context_lens, w_uk, w_uv, out)
    lens = context_lens.tolist()
    check_context(lens, block_table, kv_cache.shape[0], kv_cache.shape[1])
    q_latent = absorb_query(q_nope, q_pe, w_uk)
    return up_project(latent_attention(q_latent, lens), w_uv, out)


def decode_flops(shape: MLAShape, context_lens: list[int]) -> int:
    """Matmul flops of one absorbed decode: W_UK absorption, q.K over 576, p.V over 512, W_UV."""
    h = shape.num_heads
    tokens = sum(context_lens)
    attention = 2 * h * tokens * (shape.latent_dim + shape.kv_lora_rank)
    projections = 2 * len(context_lens) * h * shape.kv_lora_rank * (shape.qk_nope_dim + shape.v_head_dim)
    return attention + projections


def decode_bytes(shape: MLAShape, context_lens: list[int], elem_bytes: int) -> int:
    """Bytes a decode must move at least once: the latent of every context token, W_UK, W_UV, q and out."""
    h, batch = shape.num_heads, len(context_lens)
    latent = sum(context_lens) * shape.latent_dim
    weights = h * shape.kv_lora_rank * (shape.qk_nope_dim + shape.v_head_dim)
    activations = batch * h * (shape.qk_nope_dim + shape.rope_dim + shape.v_head_dim)
    return (latent + weights + activations) * elem_bytes
