"""opts.k3: K3's dimensions (full and tiny), per-rank sizes, and the shared norms and gate."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import yaml

from ablations.backends.sim.models import MODELS
from ablations.backends.vllm.config import ModelConfig
from opts.k3 import (
    K3,
    K3_TINY,
    L2_NORM_EPS,
    TINY_CONFIG,
    K3Spec,
    gated_rms_norm,
    kda_gate,
    l2_normalize,
    rms_norm_f64,
    rms_norm_fp32,
    rms_norm_native,
    spec_from_config,
)

TINY_YAML = Path(__file__).parents[3] / "conf/model/k3_tiny.yaml"


def test_full_k3_sizes() -> None:
    assert (K3.num_layers, K3.num_kda_layers, K3.num_mla_layers, K3.hidden) == (93, 69, 24, 7168)
    assert (K3.latent_dim, K3.num_res_blocks) == (576, 8)
    assert K3.softmax_scale == pytest.approx(1 / math.sqrt(192))
    assert (K3.mla_heads_per_rank(8), K3.kda_heads_per_rank(8), K3.kda_heads_per_rank(1)) == (12, 12, 96)


def test_tiny_is_defined_once_and_every_place_derives_from_it() -> None:
    assert K3Spec(
        name="k3_tiny", num_layers=4, num_kda_layers=2, hidden=256,
        mla_heads=4, q_lora_rank=128, kv_lora_rank=512, rope_dim=64, qk_nope_dim=64, v_head_dim=64,
        kda_heads=4, kda_head_dim=64, conv_width=4,
        num_experts=8, num_shared_experts=1, experts_per_token=2, expert_latent=128, moe_intermediate=128,
        attn_res_block=2, mtp_layers=1,
    ) == K3_TINY
    conf = yaml.safe_load(TINY_YAML.read_text())
    assert set(conf) == {"defaults", "name"}     # the YAML states no size: the schema's defaults are TINY_CONFIG
    model = ModelConfig()
    assert {k: getattr(model, k) for k in TINY_CONFIG} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in TINY_CONFIG.items()}
    assert spec_from_config("k3_tiny", {**TINY_CONFIG, "hidden_size": 512}).hidden == 512
    sim = MODELS["k3_tiny"]
    assert (sim.spec, sim.vocab_size, sim.dense_intermediate, sim.weight_bytes) == (K3_TINY, 1024, 512, 4.0)


def test_invalid_sizes_are_named() -> None:
    with pytest.raises(ValueError, match=r"tp: invalid value 7; valid: an integer >= 1 dividing mla_heads \(96\)"):
        K3.mla_heads_per_rank(7)
    with pytest.raises(ValueError, match=r"K3Spec.hidden: invalid value 0"):
        dataclasses.replace(K3, hidden=0)
    with pytest.raises(ValueError, match=r"K3Spec.num_kda_layers"):
        dataclasses.replace(K3, num_kda_layers=93)


def test_rms_norm_variants_round_differently() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = (1 + torch.randn(64, generator=gen) / 4).to(torch.bfloat16)
    exact = rms_norm_f64(x, w, 1e-6)
    native, fp32 = rms_norm_native(x, w, 1e-6), rms_norm_fp32(x, w, 1e-6)
    assert native.dtype == torch.bfloat16 and fp32.dtype == torch.float32
    torch.testing.assert_close(fp32.double(), exact, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(native.double(), exact, atol=2e-2, rtol=2e-2)
    gate = torch.randn(4, 64, generator=gen)
    torch.testing.assert_close(gated_rms_norm(x, gate, w, 1e-6), fp32 * torch.sigmoid(gate))


def test_l2_normalize_and_gate() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 8, dtype=torch.float64, generator=gen)
    x[0, 0] *= 1e-4                     # a tiny vector: the epsilon inside the square root matters
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_NORM_EPS)
    torch.testing.assert_close(l2_normalize(x), expected, atol=0, rtol=1e-12)
    assert l2_normalize(x)[0, 0].norm() < 0.999
    raw, a_log = torch.randn(3, 2, 8, generator=gen), torch.randn(2, generator=gen)
    bias = torch.randn(16, generator=gen)
    a = a_log.exp().view(2, 1)
    torch.testing.assert_close(kda_gate(raw, a_log, bias, -5.0), -5.0 * torch.sigmoid(a * (raw + bias.view(2, 8))))
    torch.testing.assert_close(kda_gate(raw, a_log, None, None), -a * torch.log1p(raw.exp()))


def test_packages_take_their_per_rank_sizes_from_the_spec() -> None:
    from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape
    from opts.k3.mla import K3_TP8, MLAShape
    from opts.kda_overlap.cases import K3_HEAD_DIM, K3_HEADS

    assert K3_TP8 == MLAShape() == MLAShape(12, 512, 64, 128, 128)
    assert MLAShape.per_rank(K3_TINY, 2) == MLAShape(2, 512, 64, 64, 64)
    assert (K3_HEADS, K3_HEAD_DIM) == (12, 128)
    kda, norm, res = KdaDecodeShape(1), MlaNormShape(1), AttnResShape(1, 0)
    assert (kda.num_heads, kda.head_dim, kda.conv_width) == (12, 128, 4)
    assert (norm.q_lora_rank, norm.kv_lora_rank, norm.rope_dim, res.hidden, res.max_blocks) == (1536, 512, 64, 7168, 8)
