"""A tiny K3-like stack whose verify and draft passes `step_times.py` times on the CPU (fp32, random weights).

Decoder layers: KDA (short conv, L2-normalised q/k, per-channel forget gate, beta gate, the recurrence from the
cached state keeping every position's state as speculative verification does, gated RMSNorm) or absorbed MLA
(`opts/k3/mla.py`), each followed by a latent MoE (router top-k, routed SwiGLU experts in a narrower latent, one shared
SwiGLU expert). The MTP head is K3's: embedding and hidden state normed, joined by eh_proj, one MLA decoder
layer, the shared LM head.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from opts.k3 import K3, K3Spec, gated_rms_norm, kda_gate, l2_normalize, recurrent_kda_states, rms_norm_fp32
from opts.k3.mla import EPS, MlaWeights

MEASURE_SPEC = K3Spec(
    name="k3_draft_measure", num_layers=8, num_kda_layers=6, hidden=1024,
    mla_heads=8, q_lora_rank=384, kv_lora_rank=256, rope_dim=32, qk_nope_dim=64, v_head_dim=64,
    kda_heads=8, kda_head_dim=64, conv_width=K3.conv_width,
    num_experts=16, num_shared_experts=2, experts_per_token=2, expert_latent=512, moe_intermediate=384,
    attn_res_block=2, mtp_layers=1,
)


@dataclass(frozen=True)
class StackShape:
    """The measured stack: `spec`'s sizes (KDA layers first, then MLA, as K3's every 4th layer is MLA; routed experts
    moe_intermediate wide in the latent, the shared experts one SwiGLU num_shared_experts * moe_intermediate wide
    in hidden), a vocabulary, `context` cached tokens per sequence."""

    spec: K3Spec = MEASURE_SPEC
    vocab: int = 8192
    context: int = 256

    def __post_init__(self) -> None:
        if not isinstance(self.spec, K3Spec):
            raise ValueError(f"StackShape.spec: invalid value {self.spec!r}; valid: a K3Spec")
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StackShape.{f.name}: invalid value {value!r}; valid: an integer >= 1")


def _w(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator) / shape[-2] ** 0.5


@dataclass(frozen=True)
class KdaWeights:
    """One KDA layer (flash-linear-attention conventions, `opts.k3.kda`)."""

    w_qkv: torch.Tensor    # [hidden, 3 H dk]
    conv: torch.Tensor     # [width, 3 H dk], depthwise causal
    f_a: torch.Tensor      # [hidden, dk]: forget gate, low rank
    f_b: torch.Tensor      # [dk, H dk]
    a_log: torch.Tensor    # [H]
    dt_bias: torch.Tensor  # [H dk]
    w_beta: torch.Tensor   # [hidden, H]
    g_a: torch.Tensor      # [hidden, dv]: output gate, low rank
    g_b: torch.Tensor      # [dv, H dv]
    o_norm: torch.Tensor   # [dv]
    w_o: torch.Tensor      # [H dv, hidden]

    @classmethod
    def random(cls, spec: K3Spec, generator: torch.Generator) -> KdaWeights:
        h, d, hidden = spec.kda_heads, spec.kda_head_dim, spec.hidden
        return cls(_w(generator, hidden, 3 * h * d), torch.randn(spec.conv_width, 3 * h * d, generator=generator) / 2,
                   _w(generator, hidden, d), _w(generator, d, h * d), torch.zeros(h), torch.zeros(h * d),
                   _w(generator, hidden, h), _w(generator, hidden, d), _w(generator, d, h * d), torch.ones(d),
                   _w(generator, h * d, hidden))

    def forward(self, x: torch.Tensor, state: torch.Tensor, conv_state: torch.Tensor) -> torch.Tensor:
        """x [b, T, hidden] on top of the cached recurrent state [b, H, dk, dv] and conv inputs [b, width-1, 3 H dk];
        every position's state is computed (speculative verification keeps them). Returns [b, T, hidden]."""
        b, t, _ = x.shape
        h, dk, dv = state.shape[1:]
        padded = torch.cat([conv_state, x @ self.w_qkv], dim=1)
        mixed = F.silu((padded.unfold(1, self.conv.shape[0], 1) * self.conv.T).sum(-1))
        q, k, v = (y.reshape(b, t, h, dk) for y in mixed.split(h * dk, dim=-1))
        g = kda_gate(((x @ self.f_a) @ self.f_b).view(b, t, h, dk), self.a_log, self.dt_bias, None)
        beta = torch.sigmoid(x @ self.w_beta)
        o, _ = recurrent_kda_states(l2_normalize(q), l2_normalize(k), v, g, beta, initial_state=state)
        o = gated_rms_norm(o, ((x @ self.g_a) @ self.g_b).view(b, t, h, dv), self.o_norm, EPS)
        return o.reshape(b, t, h * dv) @ self.w_o


@dataclass(frozen=True)
class MoeWeights:
    """Latent MoE: sigmoid router, top-k routed SwiGLU experts in the latent, one shared SwiGLU expert."""

    router: torch.Tensor   # [hidden, E]
    down: torch.Tensor     # [hidden, latent]
    w13: torch.Tensor      # [E, latent, 2 I]
    w2: torch.Tensor       # [E, I, latent]
    up: torch.Tensor       # [latent, hidden]
    shared13: torch.Tensor  # [hidden, 2 Is]
    shared2: torch.Tensor  # [Is, hidden]
    top_k: int

    @classmethod
    def random(cls, shape: StackShape, generator: torch.Generator) -> MoeWeights:
        """Random weights, seeded by `generator`."""
        spec = shape.spec
        hidden, latent, experts, inter = spec.hidden, spec.expert_latent, spec.num_experts, spec.moe_intermediate
        shared = spec.num_shared_experts * inter
        return cls(_w(generator, hidden, experts), _w(generator, hidden, latent),
                   _w(generator, experts, latent, 2 * inter), _w(generator, experts, inter, latent),
                   _w(generator, latent, hidden), _w(generator, hidden, 2 * shared), _w(generator, shared, hidden),
                   spec.experts_per_token)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [b, T, hidden] -> [b, T, hidden]; each expert runs over the tokens routed to it."""
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = torch.sigmoid(flat @ self.router).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        latent = flat @ self.down
        out = torch.zeros_like(latent)
        for e in ids.unique().tolist():
            token, slot = (ids == e).nonzero(as_tuple=True)
            gate, up = (latent[token] @ self.w13[e]).chunk(2, dim=-1)
            out.index_add_(0, token, (F.silu(gate) * up) @ self.w2[e] * weights[token, slot, None])
        gate, up = (flat @ self.shared13).chunk(2, dim=-1)
        return (out @ self.up + (F.silu(gate) * up) @ self.shared2).view_as(x)


@dataclass(frozen=True)
class StackCache:
    """Per-sequence caches for `batch` sequences: KDA states and conv inputs, MLA latents (context + room)."""

    kda_states: tuple[torch.Tensor, ...]
    conv_states: tuple[torch.Tensor, ...]
    latents: tuple[torch.Tensor, ...]
    mtp_latents: torch.Tensor

    @property
    def batch(self) -> int:
        return self.mtp_latents.shape[0]


@dataclass(frozen=True)
class Stack:
    """The measured model: decoder layers, the LM head, the MTP head."""

    shape: StackShape
    embed: torch.Tensor   # [vocab, hidden]
    mixers: tuple[KdaWeights | MlaWeights, ...]
    moes: tuple[MoeWeights, ...]
    lm_head: torch.Tensor  # [hidden, vocab]
    eh_proj: torch.Tensor  # [2 hidden, hidden]
    mtp_mixer: MlaWeights
    mtp_moe: MoeWeights

    @classmethod
    def random(cls, shape: StackShape, seed: int = 0) -> Stack:
        """Random weights, seeded."""
        generator = torch.Generator().manual_seed(seed)
        spec = shape.spec

        def mla() -> MlaWeights:
            return MlaWeights.random(spec.hidden, spec.mla_heads, spec.q_lora_rank, spec.kv_lora_rank,
                                     spec.qk_nope_dim, spec.rope_dim, spec.v_head_dim, generator)

        mixers = tuple(KdaWeights.random(spec, generator) if i < spec.num_kda_layers else mla()
                       for i in range(spec.num_layers))
        moes = tuple(MoeWeights.random(shape, generator) for _ in range(spec.num_layers))
        return cls(shape, torch.randn(shape.vocab, spec.hidden, generator=generator), mixers, moes,
                   _w(generator, spec.hidden, shape.vocab), _w(generator, 2 * spec.hidden, spec.hidden), mla(),
                   MoeWeights.random(shape, generator))

    def new_cache(self, batch: int, max_new: int, seed: int = 0) -> StackCache:
        """Caches of `batch` sequences holding `shape.context` random tokens' worth, room for `max_new` more."""
        generator = torch.Generator().manual_seed(seed)
        spec, rows = self.shape.spec, self.shape.context + max_new
        h, d = spec.kda_heads, spec.kda_head_dim
        kda = [m for m in self.mixers if isinstance(m, KdaWeights)]
        width = spec.kv_lora_rank + spec.rope_dim
        return StackCache(
            tuple(torch.randn(batch, h, d, d, generator=generator) * 0.1 for _ in kda),
            tuple(torch.randn(batch, spec.conv_width - 1, 3 * h * d, generator=generator) for _ in kda),
            tuple(torch.randn(batch, rows, width, generator=generator) for _ in range(spec.num_mla_layers)),
            torch.randn(batch, rows, width, generator=generator))

    def verify(self, cache: StackCache, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's pass over `tokens` [b, K+1] (the last sampled token and K drafts per sequence) on top of the
        cached context. Returns (the target's greedy tokens [b, K+1], the last layer's hidden [b, K+1, hidden])."""
        x = self.embed[tokens]
        ones = torch.ones(x.shape[-1])
        kda, mla = iter(zip(cache.kda_states, cache.conv_states, strict=True)), iter(cache.latents)
        for mixer, moe in zip(self.mixers, self.moes, strict=True):
            normed = rms_norm_fp32(x, ones, EPS)
            if isinstance(mixer, KdaWeights):
                x = x + mixer.forward(normed, *next(kda))
            else:
                x = x + mixer.forward(normed, next(mla), self.shape.context)
            x = x + moe.forward(rms_norm_fp32(x, ones, EPS))
        logits = rms_norm_fp32(x, ones, EPS) @ self.lm_head
        return logits.argmax(-1), x

    def draft(self, cache: StackCache, tokens: torch.Tensor, hidden: torch.Tensor, k: int) -> torch.Tensor:
        """K passes of the MTP head over b tokens: from each sequence's last token [b] and hidden [b, hidden],
        propose `k` greedy drafts [b, k], each pass attending over the MTP cache and the drafts before it."""
        ones = torch.ones(hidden.shape[-1])
        drafts = []
        for j in range(k):
            x = torch.cat([rms_norm_fp32(self.embed[tokens], ones, EPS), rms_norm_fp32(hidden, ones, EPS)], -1)
            x = (x @ self.eh_proj)[:, None]
            x = x + self.mtp_mixer.forward(rms_norm_fp32(x, ones, EPS), cache.mtp_latents, self.shape.context + j)
            x = x + self.mtp_moe.forward(rms_norm_fp32(x, ones, EPS))
            hidden = x[:, 0]
            tokens = (rms_norm_fp32(hidden, ones, EPS) @ self.lm_head).argmax(-1)
            drafts.append(tokens)
        return torch.stack(drafts, dim=1) if drafts else tokens.new_empty(tokens.shape[0], 0)
