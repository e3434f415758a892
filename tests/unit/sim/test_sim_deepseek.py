"""DeepSeek-R1 in the simulator against a hand calculation from its public config.json (61 layers, 3 dense, MLA
with 128 heads and no output gate, 256 routed experts of 2,048 on the hidden state, top 8, 1 shared expert, one
MTP layer, FP8 weights with a fp32 scale per 128 x 128 block), at TP8 with experts split by slice (TP8): every
number is multiplied out here, not taken from the code under test."""

from __future__ import annotations

import dataclasses

import pytest

from ablations.backends.sim.cost import Mechanisms, Parallel, Seq, step_costs, weights_per_rank
from ablations.backends.sim.models import DEEPSEEK_R1, MODELS
from opts.k3.cache.geometry import attention_geometry, geometry

R1 = MODELS["deepseek_r1"]
P = Parallel(tp=8, moe="tp")
FP8 = 1 + 4 / (128 * 128)
# MLA per rank: fused q/kv down 7168 x (1536 + 576) (replicated), q_b 1536 x (16·192), o_proj (16·128) x 7168, and
# the absorbed decode's kv_b 512 x (16·256); no output gate.
MLA = 7168 * 2112 + 1536 * 3072 + 2048 * 7168 + 512 * 4096                 # 36,175,872
# MoE outside the routed experts: router 7168 x 256, the shared expert (2,048 / 8 = 256) 7168 x 512 and 256 x 7168.
MOE = 7168 * 256 + 7168 * 512 + 256 * 7168                                    # 7,340,032
EXPERT = 3 * 7168 * 2048                                                      # 44,040,192
DENSE = 7168 * 2 * 2304 + 2304 * 7168                                         # 18,432 / 8 = 2,304
HEAD = 7168 * 129280 // 8                                                     # bf16, embedding the same


def test_weights_per_rank_by_hand():
    layers = 61 * MLA + 58 * (MOE + 256 * EXPERT / 8) + 3 * DENSE
    mtp = MLA + MOE + 256 * EXPERT / 8 + 2 * 7168 * 7168
    want = (layers + mtp) * FP8 + 2 * HEAD * 2
    assert weights_per_rank(R1, P) == pytest.approx(want, rel=1e-12)
    assert 86e9 < want < 87.5e9          # 685 B parameters (671 B + the MTP layer's) in FP8, / 8


def test_one_decode_step_reads_and_reduces_as_vllm_runs_it():
    step = step_costs(R1, P, [Seq(1, 1000, "decode")] * 4)
    assert {"kda_proj", "kda_recurrent", "attn_res", "moe_latent"}.isdisjoint(step)   # no KDA, latent, residual mix
    # one all-reduce per MLA output, per MoE layer (shared + routed summed first: models/deepseek_v2.py:370,394)
    # and per dense FFN
    assert step["mla_proj"].collectives == 61 and step["mla_proj"].comm_bytes == 61 * 4 * 7168 * 2
    assert step["moe_experts"].collectives == 58 and step["moe_shared"].collectives == 0
    assert step["dense_ffn"].collectives == 3
    touched = 256 * (1 - (1 - 8 / 256) ** 4)
    assert step["moe_experts"].weight_bytes == pytest.approx(58 * touched * EXPERT / 8 * FP8)
    assert step["mla_proj"].weight_bytes == pytest.approx(61 * (MLA - 512 * 4096) * FP8)
    assert step["lm_head"].weight_bytes == HEAD * 2
    # the latent cache: 576 bf16 values a token a layer, the 1,000 cached and the new one read, the new one written
    assert step["mla_decode"].cache_bytes == pytest.approx(61 * 4 * (1001 + 1) * 576 * 2)


def test_moe_dedup_is_refused_without_a_latent():
    with pytest.raises(ValueError, match="moe_dedup: deepseek_r1 has no latent MoE"):
        step_costs(R1, P, [Seq(1, 10, "decode")], Mechanisms(sharded_latent_up=True))


def test_an_attention_only_geometry_has_no_state():
    g = geometry(DEEPSEEK_R1, tp=8, kv_bytes=2)
    assert g == attention_geometry(DEEPSEEK_R1, tp=8, kv_bytes=2)
    assert (g.block_size, g.num_attn_groups, g.num_state_groups, g.state_bytes) == (64, 1, 0, 0)
    assert g.block_bytes == 64 * 576 * 2 * 61


@pytest.mark.parametrize(("change", "message"), [
    ({"kda_heads": 96}, "K3Spec.kda_heads: invalid value 96; valid: 0 exactly when num_kda_layers is 0"),
    ({"num_kda_layers": 10}, "K3Spec.kda_heads: invalid value 0; valid: 0 exactly when num_kda_layers is 0"),
    ({"mla_heads": 0}, "K3Spec.mla_heads: invalid value 0; valid: an integer >= 1"),
    ({"mla_output_gate": 1}, "K3Spec.mla_output_gate: invalid value 1; valid: a bool"),
])
def test_a_spec_without_a_part_is_consistent(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEEPSEEK_R1, **change)
