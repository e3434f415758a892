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
ALIGNMENT = 16             # bytes: where a page's state starts
F32_BYTES = 4


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype = torch.float32,
           device: str = "cpu") -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


@dataclass(frozen=True)
class KdaDecodeLayer:
    """One KDA layer's decode parameters (per rank), as vLLM holds them. conv_weight [3HD, W] in the activation
    dtype; A_log [H] and dt_bias [H*D] fp32; norm_weight [D]. `lower_bound` None selects the softplus gate
    instead of the safe gate."""

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
    """One decode step's tensors, as vLLM hands them to the decode. mixed_qkv [N, 3HD] (pre-conv); raw_g
    [N, H, D]; raw_beta [N, H] (logit); output_gate [N, H, D]; each request's conv window and recurrent state in
    vLLM's slot pools, conv_pool [P, 3HD, W-1] (activation dtype) and state_pool [P, H, dv, dk] (fp32, the
    kernels' layout), at `slots` [N] (int32; slot 0 is vLLM's null block); both pools updated in place."""

    mixed_qkv: torch.Tensor
    raw_g: torch.Tensor
    raw_beta: torch.Tensor
    output_gate: torch.Tensor
    conv_pool: torch.Tensor
    state_pool: torch.Tensor
    slots: torch.Tensor

    @property
    def conv_state(self) -> torch.Tensor:
        """The requests' conv windows [N, 3HD, W-1] (a copy)."""
        return self.conv_pool[self.slots.long()]

    @property
    def state(self) -> torch.Tensor:
        """The requests' recurrent states [N, H, dv, dk] (a copy)."""
        return self.state_pool[self.slots.long()]

    def clone(self) -> KdaDecodeStep:
        """The same activations (read only, still views) with copies of the two pools, laid out as these."""
        slots, channels, window = self.conv_pool.shape
        conv_pool, state_pool = slot_pools(slots, channels, window + 1, self.state_pool.shape[1],
                                           self.state_pool.shape[2], self.conv_pool.dtype, self.conv_pool.device)
        conv_pool.copy_(self.conv_pool)
        state_pool.copy_(self.state_pool)
        return replace(self, conv_pool=conv_pool, state_pool=state_pool)


def slot_pools(num_slots: int, channels: int, conv_width: int, num_heads: int, head_dim: int, dtype: torch.dtype,
               device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Empty conv and recurrent state pools laid out as vLLM 0.32's hybrid cache holds a KDA layer's: one page
    per slot, the conv window first (the default "SD" layout: [W-1, 3HD] in `dtype`, handed to the decode
    transposed), then the fp32 state [H, dv, dk]; two views of one storage with different bases. Returns
    (conv_pool [slots, 3HD, W-1], state_pool [slots, H, dv, dk])."""
    conv_bytes = channels * (conv_width - 1) * dtype.itemsize
    conv_bytes += -conv_bytes % ALIGNMENT
    page = conv_bytes + num_heads * head_dim * head_dim * F32_BYTES
    storage = torch.empty(num_slots * page, dtype=torch.uint8, device=device).untyped_storage()

    def view(dt: torch.dtype, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]) -> torch.Tensor:
        return torch.empty(0, dtype=dt, device=device).set_(storage, offset // dt.itemsize, shape, stride)

    conv = view(dtype, 0, (num_slots, conv_width - 1, channels), (page // dtype.itemsize, channels, 1))
    state = view(torch.float32, conv_bytes, (num_slots, num_heads, head_dim, head_dim),
                 (page // F32_BYTES, head_dim * head_dim, head_dim, 1))
    return conv.transpose(1, 2), state


def decode_args(layer: KdaDecodeLayer, step: KdaDecodeStep, out: torch.Tensor) -> tuple:
    """The arguments of the engine's decode step (`naive.kda_decode_slots_unfused`,
    `passes.kda_decode_slots_fused`) for `step` writing `out` [N, H, D]."""
    return (step.mixed_qkv, step.conv_pool, layer.conv_weight, step.raw_g, step.raw_beta, layer.A_log,
            layer.dt_bias, step.state_pool, step.slots, step.output_gate, layer.norm_weight, out, layer.lower_bound,
            layer.qk_scale, layer.norm_eps)


@dataclass(frozen=True)
class MlaNormLayer:
    """The two RMSNorm weights of an MLA layer's q and kv latents."""

    q_weight: torch.Tensor
    kv_weight: torch.Tensor
    eps: float = RMS_NORM_EPS

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
    """A layer and a step with non-zero conv and recurrent states. The activations are views of one in_proj
    row [N, shape.projection_width] (q, k, v, output gate, f_a, beta), as vLLM splits it; the states sit in
    pools of N + 1 slots (`slot_pools`, every slot filled, the null one too) at a shuffled order of slots
    1..N."""
    gen = _generator(seed)
    n, h, d, w = shape.num_tokens, shape.num_heads, shape.head_dim, shape.conv_width
    hd = h * d
    kw = {"dtype": dtype, "device": device}
    proj = _randn(gen, n, shape.projection_width, **kw)
    layer = KdaDecodeLayer(
        conv_weight=_randn(gen, 3 * hd, w, scale=0.5, **kw),
        A_log=(torch.rand(h, generator=gen) * 15 + 1).log().to(device),
        dt_bias=_randn(gen, hd, scale=0.5, device=device),
        norm_weight=(1 + _randn(gen, d, scale=0.1)).to(**kw),
        lower_bound=lower_bound,
    )
    conv_pool, state_pool = slot_pools(n + 1, 3 * hd, w, h, d, dtype, device)
    conv_pool.copy_(_randn(gen, n + 1, 3 * hd, w - 1))
    state_pool.copy_(_randn(gen, n + 1, h, d, d, scale=0.3))
    step = KdaDecodeStep(
        mixed_qkv=proj[:, :3 * hd],
        raw_g=_randn(gen, n, h, d, **kw),
        raw_beta=proj[:, shape.beta_offset:shape.beta_offset + h],
        # the projection's row stride even for one row (where a view would recompute it), as the engine's gate
        output_gate=proj[:, shape.gate_offset:shape.gate_offset + hd].as_strided((n, h, d), (proj.stride(0), d, 1)),
        conv_pool=conv_pool,
        state_pool=state_pool,
        slots=(torch.randperm(n, generator=gen) + 1).to(device=device, dtype=torch.int32),
    )
    return layer, step


def make_mla_norm(shape: MlaNormShape, dtype: torch.dtype = torch.bfloat16, device: str = "cpu",
                  seed: int = 0) -> tuple[MlaNormLayer, torch.Tensor]:
    """The layer's two norm weights and a fused q_a/kv_a projection output [N, q_lora + kv_lora + rope]."""
    gen = _generator(seed)
    kw = {"dtype": dtype, "device": device}
    layer = MlaNormLayer(q_weight=(1 + _randn(gen, shape.q_lora_rank, scale=0.1)).to(**kw),
                         kv_weight=(1 + _randn(gen, shape.kv_lora_rank, scale=0.1)).to(**kw))
    return layer, _randn(gen, shape.num_tokens, shape.width, **kw)


def norm_args(layer: MlaNormLayer, qkv_lora: torch.Tensor) -> tuple:
    """The arguments of vLLM's `fused_q_kv_rmsnorm` (`naive.q_kv_rms_norm`, `passes.q_kv_rms_norm_fused`) for the
    projection output `qkv_lora` [N, q_lora + kv_lora + rope]: the q and kv latents as views of it."""
    q, kv = layer.q_lora_rank, layer.kv_lora_rank
    return qkv_lora[:, :q], qkv_lora[:, q:q + kv], layer.q_weight, layer.kv_weight, layer.eps


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
