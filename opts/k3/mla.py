"""K3's absorbed MLA, the one home of it: the decode shapes and the parts every paged decode path shares (input
checks, W_UK absorption, W_UV; aiter_mla's kernels), and the dense causal form over a latent cache with one layer's
weights and its float64 expanded reference (draft_length's measured stack).

Absorbed: queries are carried into the latent space (q W_uk^h), attend over the cached latents [c ; rope slot]
directly, and the result leaves through W_uv^h. Weights in vLLM's layout: w_uk [H, qk_nope, kv_lora],
w_uv [H, v_head, kv_lora]. No rotary in the dense form (K3 keeps the 64-wide rope slot without rotating it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from opts.k3.norms import rms_norm_fp32
from opts.k3.spec import K3, TP, K3Spec, mla_latent_dim, mla_softmax_scale

EPS = 1e-6   # the q / kv RMSNorms' epsilon


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


def absorbed_attention(q_nope: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor, w_uk: torch.Tensor,
                       w_uv: torch.Tensor, num_new: int, scale: float) -> torch.Tensor:
    """Attention of the last `num_new` rows of `latents` (causal) over all of them, in the latent space.

    q_nope [b, T, H, dn], q_rope [b, T, H, dr], latents [b, S, kv_lora + dr], w_uk [H, dn, kv_lora],
    w_uv [H, dv, kv_lora]. Returns [b, T, H, dv]."""
    rank = w_uk.shape[2]
    q_latent = torch.einsum("bthd,hdr->bthr", q_nope, w_uk)
    scores = torch.einsum("bthl,bsl->bhts", torch.cat([q_latent, q_rope], dim=-1), latents) * scale
    context = latents.shape[1] - num_new
    t = torch.arange(num_new, device=latents.device)[:, None]
    s = torch.arange(latents.shape[1], device=latents.device)[None, :]
    scores = scores.masked_fill(s > context + t, float("-inf"))
    out_latent = torch.einsum("bhts,bsr->bthr", scores.softmax(-1), latents[..., :rank])
    return torch.einsum("bthr,hdr->bthd", out_latent, w_uv)


def expanded_attention(q_nope: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor, w_uk: torch.Tensor,
                       w_uv: torch.Tensor, num_new: int, scale: float) -> torch.Tensor:
    """`absorbed_attention`'s float64 reference, its latents decompressed: keys k = [c W_uk^h ; rope slot],
    values v = c W_uv^h (same arguments and shapes)."""
    q_nope, q_rope, latents, w_uk, w_uv = (x.to(torch.float64) for x in (q_nope, q_rope, latents, w_uk, w_uv))
    rank = w_uk.shape[2]
    c, rope = latents[..., :rank], latents[..., rank:]
    keys = torch.einsum("bsr,hdr->bshd", c, w_uk)
    values = torch.einsum("bsr,hdr->bshd", c, w_uv)
    scores = (torch.einsum("bthd,bshd->bhts", q_nope, keys) + torch.einsum("bthd,bsd->bhts", q_rope, rope)) * scale
    context = latents.shape[1] - num_new
    t = torch.arange(num_new)[:, None]
    s = torch.arange(latents.shape[1])[None, :]
    scores = scores.masked_fill(s > context + t, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", scores.softmax(-1), values)


@dataclass(frozen=True)
class MlaWeights:
    """One MLA layer's weights (fp32): hidden -> q-LoRA -> heads (nope + rope), hidden -> latent (kv-LoRA + rope)."""

    wq_a: torch.Tensor    # [hidden, q_lora]
    q_norm: torch.Tensor  # [q_lora]
    wq_b: torch.Tensor    # [q_lora, heads * (dn + dr)]
    wkv_a: torch.Tensor   # [hidden, kv_lora + dr]
    kv_norm: torch.Tensor  # [kv_lora]
    w_uk: torch.Tensor    # [heads, dn, kv_lora]
    w_uv: torch.Tensor    # [heads, dv, kv_lora]
    w_gate: torch.Tensor  # [hidden, heads * dv]
    w_o: torch.Tensor     # [heads * dv, hidden]

    @classmethod
    def random(cls, hidden: int, heads: int, q_lora: int, kv_lora: int, dn: int, dr: int, dv: int,
               generator: torch.Generator) -> MlaWeights:
        """Random weights scaled so activations stay O(1) (W_uk, W_uv by 1/sqrt(kv_lora))."""
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator) / shape[-2] ** 0.5

        return cls(w(hidden, q_lora), torch.ones(q_lora), w(q_lora, heads * (dn + dr)), w(hidden, kv_lora + dr),
                   torch.ones(kv_lora), w(heads, kv_lora, dn).transpose(1, 2).contiguous(),
                   w(heads, kv_lora, dv).transpose(1, 2).contiguous(), w(hidden, heads * dv), w(heads * dv, hidden))

    @property
    def latent_dim(self) -> int:
        return self.wkv_a.shape[1]

    def forward(self, x: torch.Tensor, latents: torch.Tensor, start: int) -> torch.Tensor:
        """x [b, T, hidden]: write its T latents at rows start..start+T of `latents` [b, S, kv_lora + dr] and attend
        causally over rows 0..start+T. Returns [b, T, hidden]."""
        b, t, _ = x.shape
        heads, dn, kv_lora = self.w_uk.shape
        dv = self.w_uv.shape[1]
        dr = self.latent_dim - kv_lora
        q = (rms_norm_fp32(x @ self.wq_a, self.q_norm, EPS) @ self.wq_b).view(b, t, heads, dn + dr)
        kv = x @ self.wkv_a
        latents[:, start:start + t, :kv_lora] = rms_norm_fp32(kv[..., :kv_lora], self.kv_norm, EPS)
        latents[:, start:start + t, kv_lora:] = kv[..., kv_lora:]
        scale = mla_softmax_scale(dn, dr)
        o = absorbed_attention(q[..., :dn], q[..., dn:], latents[:, :start + t], self.w_uk, self.w_uv, t, scale)
        o = o.reshape(b, t, heads * dv) * torch.sigmoid(x @ self.w_gate)
        return o @ self.w_o
