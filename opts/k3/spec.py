"""Kimi K3's dimensions: one spec type and the full model (the tiny one the vLLM backend serves: `tiny.py`).
The same type describes a model built from a subset of K3's parts (the simulator's DeepSeek-R1: MLA and a plain
MoE only)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

TP = 8
OPTIONAL_PARTS = ("num_kda_layers", "expert_latent", "attn_res_block")   # 0: the model has no such part


@dataclass(frozen=True)
class K3Spec:
    """Sizes of a K3-family model (DESIGN.md, "Kimi K3, as the code models it"). A part K3 has and another model
    lacks is 0: `num_kda_layers` 0, no KDA layers (then `kda_heads`, `kda_head_dim` and `conv_width` are 0 too);
    `expert_latent` 0, routed experts on the hidden state itself (a plain MoE, no latent projections);
    `attn_res_block` 0, plain residuals; `mla_output_gate` False, no sigmoid gate on the MLA output."""

    name: str
    num_layers: int
    num_kda_layers: int
    hidden: int
    mla_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    rope_dim: int
    qk_nope_dim: int
    v_head_dim: int
    kda_heads: int
    kda_head_dim: int
    conv_width: int
    num_experts: int
    num_shared_experts: int
    experts_per_token: int
    expert_latent: int
    moe_intermediate: int
    attn_res_block: int
    mtp_layers: int
    mla_output_gate: bool = True

    def __post_init__(self) -> None:
        kda = ("kda_heads", "kda_head_dim", "conv_width")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "mla_output_gate"):
                continue
            low = 0 if f.name in (*OPTIONAL_PARTS, *kda) else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"K3Spec.{f.name}: invalid value {value!r}; valid: an integer >= {low}")
        if not isinstance(self.mla_output_gate, bool):
            raise ValueError(f"K3Spec.mla_output_gate: invalid value {self.mla_output_gate!r}; valid: a bool")
        for name in kda:
            if (getattr(self, name) == 0) != (self.num_kda_layers == 0):
                raise ValueError(f"K3Spec.{name}: invalid value {getattr(self, name)!r}; valid: 0 exactly when "
                                 f"num_kda_layers is 0 (it is {self.num_kda_layers})")
        if self.num_kda_layers >= self.num_layers:
            raise ValueError(f"K3Spec.num_kda_layers: invalid value {self.num_kda_layers!r}; "
                             f"valid: below num_layers ({self.num_layers})")

    @property
    def num_mla_layers(self) -> int:
        return self.num_layers - self.num_kda_layers

    @property
    def latent_dim(self) -> int:
        return mla_latent_dim(self.kv_lora_rank, self.rope_dim)

    @property
    def softmax_scale(self) -> float:
        return mla_softmax_scale(self.qk_nope_dim, self.rope_dim)

    @property
    def num_res_blocks(self) -> int:
        """Attention-residual blocks: cdiv(num_layers, attn_res_block) (0 without attention residuals)."""
        return -(-self.num_layers // self.attn_res_block) if self.attn_res_block else 0

    @property
    def expert_input(self) -> int:
        """The width the routed experts compute on: the latent, or the hidden state for a plain MoE."""
        return self.expert_latent or self.hidden

    def mla_heads_per_rank(self, tp: int = TP) -> int:
        return _per_rank("mla_heads", self.mla_heads, tp)

    def kda_heads_per_rank(self, tp: int = TP) -> int:
        return _per_rank("kda_heads", self.kda_heads, tp)


def mla_latent_dim(kv_lora_rank: int, rope_dim: int) -> int:
    """Width of one cached MLA token: kv_lora_rank + rope_dim (576 for K3)."""
    return kv_lora_rank + rope_dim


def mla_softmax_scale(qk_nope_dim: int, rope_dim: int) -> float:
    """MLA's 1/sqrt(qk_nope_dim + rope_dim) (1/sqrt(192) for K3)."""
    return 1.0 / math.sqrt(qk_nope_dim + rope_dim)


def _per_rank(name: str, heads: int, tp: int) -> int:
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or heads % tp:
        raise ValueError(f"tp: invalid value {tp!r}; valid: an integer >= 1 dividing {name} ({heads})")
    return heads // tp


K3 = K3Spec(
    name="kimi_k3", num_layers=93, num_kda_layers=69, hidden=7168,
    mla_heads=96, q_lora_rank=1536, kv_lora_rank=512, rope_dim=64, qk_nope_dim=128, v_head_dim=128,
    kda_heads=96, kda_head_dim=128, conv_width=4,
    num_experts=896, num_shared_experts=2, experts_per_token=16, expert_latent=3584, moe_intermediate=3072,
    attn_res_block=12, mtp_layers=1,
)
