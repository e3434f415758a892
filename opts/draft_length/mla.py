"""Absorbed MLA over a latent cache, as K3's MLA layers decode: queries are carried into the latent space
(q W_uk^h), attend over the cached latents [c ; rope slot] directly, and the result leaves through W_uv^h.
No rotary (K3 keeps the 64-wide rope slot without rotating it); a sigmoid output gate."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opts.k3 import rms_norm_fp32
from opts.k3.spec import mla_softmax_scale

EPS = 1e-6


def absorbed_attention(q_nope: torch.Tensor, q_rope: torch.Tensor, latents: torch.Tensor, w_uk: torch.Tensor,
                       w_uv: torch.Tensor, num_new: int, scale: float) -> torch.Tensor:
    """Attention of the last `num_new` rows of `latents` (causal) over all of them, in the latent space.

    q_nope [b, T, H, dn], q_rope [b, T, H, dr], latents [b, S, kv_lora + dr], w_uk [H, kv_lora, dn],
    w_uv [H, kv_lora, dv]. Returns [b, T, H, dv]."""
    rank = w_uk.shape[1]
    q_latent = torch.einsum("bthd,hrd->bthr", q_nope, w_uk)
    scores = torch.einsum("bthl,bsl->bhts", torch.cat([q_latent, q_rope], dim=-1), latents) * scale
    context = latents.shape[1] - num_new
    t = torch.arange(num_new, device=latents.device)[:, None]
    s = torch.arange(latents.shape[1], device=latents.device)[None, :]
    scores = scores.masked_fill(s > context + t, float("-inf"))
    out_latent = torch.einsum("bhts,bsr->bthr", scores.softmax(-1), latents[..., :rank])
    return torch.einsum("bthr,hrd->bthd", out_latent, w_uv)


@dataclass(frozen=True)
class MlaWeights:
    """One MLA layer's weights (fp32): hidden -> q-LoRA -> heads (nope + rope), hidden -> latent (kv-LoRA + rope)."""

    wq_a: torch.Tensor    # [hidden, q_lora]
    q_norm: torch.Tensor  # [q_lora]
    wq_b: torch.Tensor    # [q_lora, heads * (dn + dr)]
    wkv_a: torch.Tensor   # [hidden, kv_lora + dr]
    kv_norm: torch.Tensor  # [kv_lora]
    w_uk: torch.Tensor    # [heads, kv_lora, dn]
    w_uv: torch.Tensor    # [heads, kv_lora, dv]
    w_gate: torch.Tensor  # [hidden, heads * dv]
    w_o: torch.Tensor     # [heads * dv, hidden]

    @classmethod
    def random(cls, hidden: int, heads: int, q_lora: int, kv_lora: int, dn: int, dr: int, dv: int,
               generator: torch.Generator) -> MlaWeights:
        """Random weights scaled so activations stay O(1)."""
        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator) / shape[-2] ** 0.5

        return cls(w(hidden, q_lora), torch.ones(q_lora), w(q_lora, heads * (dn + dr)), w(hidden, kv_lora + dr),
                   torch.ones(kv_lora), w(heads, kv_lora, dn), w(heads, kv_lora, dv), w(hidden, heads * dv),
                   w(heads * dv, hidden))

    @property
    def latent_dim(self) -> int:
        return self.wkv_a.shape[1]

    def forward(self, x: torch.Tensor, latents: torch.Tensor, start: int) -> torch.Tensor:
        """x [b, T, hidden]: write its T latents at rows start..start+T of `latents` [b, S, kv_lora + dr] and attend
        causally over rows 0..start+T. Returns [b, T, hidden]."""
        b, t, _ = x.shape
        heads, kv_lora, dn = self.w_uk.shape
        dv = self.w_uv.shape[2]
        dr = self.latent_dim - kv_lora
        q = (rms_norm_fp32(x @ self.wq_a, self.q_norm, EPS) @ self.wq_b).view(b, t, heads, dn + dr)
        kv = x @ self.wkv_a
        latents[:, start:start + t, :kv_lora] = rms_norm_fp32(kv[..., :kv_lora], self.kv_norm, EPS)
        latents[:, start:start + t, kv_lora:] = kv[..., kv_lora:]
        scale = mla_softmax_scale(dn, dr)
        o = absorbed_attention(q[..., :dn], q[..., dn:], latents[:, :start + t], self.w_uk, self.w_uv, t, scale)
        o = o.reshape(b, t, heads * dv) * torch.sigmoid(x @ self.w_gate)
        return o @ self.w_o

