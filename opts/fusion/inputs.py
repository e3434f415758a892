"""Layer parameters and per-step tensors of the three mechanisms, and seeded random builders for them.

Activations come as views of one wider projection row, as vLLM hands them over (row-strided, not copied).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape

# Assumed: K3's `gate_lower_bound` is not published; -5 is flash-linear-attention's safe-gate default.
KDA_GATE_LOWER_BOUND = -5.0
KDA_NORM_EPS = 1e-5        # FusedRMSNormGated's default, which K3's o_norm keeps
RMS_NORM_EPS = 1e-6        # KimiLinearConfig.rms_norm_eps


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32,
           device: str = "cpu") -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class KdaDecodeLayer:
    """One KDA layer's decode parameters (per rank). conv_weight [3HD, W] fp32; A_log [H]; dt_bias [H*D];
    norm_weight [D]. `lower_bound` None selects the softplus gate instead of the safe gate."""

    conv_weight: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor
    norm_weight: torch.Tensor
    lower_bound: float | None = KDA_GATE_LOWER_BOUND
    norm_eps: float = KDA_NORM_EPS
    scale: float | None = None

    @property
    def num_heads(self) -> int:
        return self.A_log.shape[0]

    @property
    def head_dim(self) -> int:
        return self.norm_weight.shape[0]

    @property
    def qk_scale(self) -> float:
        return self.head_dim ** -0.5 if self.scale is None else self.scale


@dataclass(frozen=True)
class KdaDecodeStep:
    """One decode step's tensors. mixed_qkv [N, 3HD] (pre-conv); raw_g [N, H, D]; raw_beta [N, H] (logit);
    output_gate [N, H, D]; conv_state [N, 3HD, W-1] and state [N, H, dv, dk] fp32 (vLLM's kernel layout),
    both updated in place."""

    mixed_qkv: torch.Tensor
    raw_g: torch.Tensor
    raw_beta: torch.Tensor
    output_gate: torch.Tensor
    conv_state: torch.Tensor
    state: torch.Tensor

    def clone(self) -> KdaDecodeStep:
        """The same activations (read only, still views) with copies of the two states."""
        return replace(self, conv_state=self.conv_state.clone(), state=self.state.clone())


@dataclass(frozen=True)
class MlaNormLayer:
    """The two RMSNorm weights of an MLA layer's q and kv latents."""

    q_weight: torch.Tensor
    kv_weight: torch.Tensor
    eps: float = RMS_NORM_EPS
    rope_dim: int = 64

    @property
    def q_lora_rank(self) -> int:
        return self.q_weight.shape[0]

    @property
    def kv_lora_rank(self) -> int:
        return self.kv_weight.shape[0]


@dataclass(frozen=True)
class AttnResLayer:
    """One attention-residual site: the scoring RMSNorm weight and learned query (res_norm, res_proj [hidden])
    and the RMSNorm applied to the mix (the sub-layer's input norm)."""

    res_norm_weight: torch.Tensor
    res_proj_weight: torch.Tensor
    out_norm_weight: torch.Tensor
    eps: float = RMS_NORM_EPS
    out_eps: float = RMS_NORM_EPS


@dataclass(frozen=True)
class AttnResStep:
    """prefix [T, hidden] (the partial block, updated in place by delta); blocks [T, max_blocks, hidden]
    (block `block_write_idx` written in place); delta [T, hidden] or None."""

    prefix: torch.Tensor
    blocks: torch.Tensor
    delta: torch.Tensor | None
    num_blocks: int
    block_write_idx: int = -1

    def clone(self) -> AttnResStep:
        """The same delta (read only) with copies of prefix and blocks."""
        return replace(self, prefix=self.prefix.clone(), blocks=self.blocks.clone())


def make_kda_decode(shape: KdaDecodeShape, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                    seed: int = 0, lower_bound: float | None = KDA_GATE_LOWER_BOUND
                    ) -> tuple[KdaDecodeLayer, KdaDecodeStep]:
    """A layer and a step with non-zero conv and recurrent states. The activations are views of one
    [N, 4HD + D + H] in_proj row (q, k, v, output gate, f_a, beta), as vLLM splits it."""
    gen = _generator(seed)
    n, h, d, w = shape.num_tokens, shape.num_heads, shape.head_dim, shape.conv_width
    hd = h * d
    kw = {"dtype": dtype, "device": device}
    proj = _randn(gen, n, 4 * hd + d + h, **kw)
    layer = KdaDecodeLayer(
        conv_weight=_randn(gen, 3 * hd, w, scale=0.5, device=device),
        A_log=(torch.rand(h, generator=gen) * 15 + 1).log().to(device),
        dt_bias=_randn(gen, hd, scale=0.5, device=device),
        norm_weight=(1 + _randn(gen, d, scale=0.1)).to(**kw),
        lower_bound=lower_bound,
    )
    step = KdaDecodeStep(
        mixed_qkv=proj[:, :3 * hd],
        raw_g=_randn(gen, n, h, d, **kw),
        raw_beta=proj[:, 4 * hd + d:4 * hd + d + h],
        output_gate=proj[:, 3 * hd:4 * hd].unflatten(-1, (h, d)),
        conv_state=_randn(gen, n, 3 * hd, w - 1, **kw),
        state=_randn(gen, n, h, d, d, scale=0.3, device=device),
    )
    return layer, step


def make_mla_norm(shape: MlaNormShape, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                  seed: int = 0) -> tuple[MlaNormLayer, torch.Tensor]:
    """The layer's two norm weights and a fused q_a/kv_a projection output [N, q_lora + kv_lora + rope]."""
    gen = _generator(seed)
    kw = {"dtype": dtype, "device": device}
    layer = MlaNormLayer(q_weight=(1 + _randn(gen, shape.q_lora_rank, scale=0.1)).to(**kw),
                         kv_weight=(1 + _randn(gen, shape.kv_lora_rank, scale=0.1)).to(**kw),
                         rope_dim=shape.rope_dim)
    return layer, _randn(gen, shape.num_tokens, shape.width, **kw)


def make_attn_res(shape: AttnResShape, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                  seed: int = 0) -> tuple[AttnResLayer, AttnResStep]:
    """A residual site with block states of growing magnitude, as hidden states grow with depth."""
    gen = _generator(seed)
    t, hid = shape.num_tokens, shape.hidden
    kw = {"dtype": dtype, "device": device}
    layer = AttnResLayer(res_norm_weight=(1 + _randn(gen, hid, scale=0.1)).to(**kw),
                         res_proj_weight=_randn(gen, hid, scale=2 * hid ** -0.5, **kw),
                         out_norm_weight=(1 + _randn(gen, hid, scale=0.1)).to(**kw))
    growth = torch.linspace(1.0, 4.0, shape.max_blocks).view(1, -1, 1)
    blocks = (torch.randn(t, shape.max_blocks, hid, generator=gen) * growth).to(**kw)
    step = AttnResStep(prefix=_randn(gen, t, hid, scale=2.0, **kw), blocks=blocks,
                       delta=_randn(gen, t, hid, **kw) if shape.has_delta else None,
                       num_blocks=shape.num_blocks, block_write_idx=shape.block_write_idx)
    return layer, step
