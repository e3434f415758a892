"""The simulator's step cost against a hand calculation: one decode step of full-size K3 at TP8 with experts
split by expert (EP8), four requests at 1000 cached tokens each. Every number below is multiplied out by hand
from K3's published shapes (DESIGN.md), not from the code under test."""

from __future__ import annotations

import pytest

from ablations.backends.sim.cost import (
    MXFP4_BYTES,
    Cost,
    Mechanisms,
    Parallel,
    Seq,
    SimModel,
    expected_experts,
    kernel_time,
    moe_layer,
    mtp_costs,
    step_costs,
    stock_kda_decode,
    stock_mla_norm,
    weights_per_rank,
)
from opts.fusion.sim import fused_kda_decode, fused_mla_norm, unfused

R, C = 4, 1000                         # requests, cached tokens each
STEP = [Seq(1, C, "decode")] * R
BF16 = 2

# Per rank at TP8. KDA: P = 96 heads x 128 = 12288, P/8 = 1536; 12 heads; in_proj 7168 x (4·1536 + 128 + 12),
# f_b 128 x 1536, o_proj 1536 x 7168.
KDA_PARAMS = 7168 * 6284 + 128 * 1536 + 1536 * 7168            # 56,250,368
# MLA: fused q/kv down 7168 x (1536 + 576), q_b 1536 x (12·192), output gate 7168 x (12·128), o_proj 1536 x 7168;
# the absorbed decode reads kv_b, 512 x (12·256).
MLA_PARAMS = 7168 * 2112 + 1536 * 2304 + 7168 * 1536 + 1536 * 7168 + 512 * 3072     # 42,270,720
# MoE outside the routed experts: router 7168 x 896; shared experts (2 x 3072 = 6144, /8 = 768) 7168 x 1536 and
# 768 x 7168; latent down 7168 x 3584 and up 3584 x 7168 (replicated).
MOE_PARAMS = 7168 * 896 + 7168 * 1536 + 768 * 7168 + 2 * 7168 * 3584               # 74,317,824
EXPERT_PARAMS = 3 * 3584 * 3072                                   # 33,030,144 (gate, up, down)
DENSE_PARAMS = 7168 * 2 * 2304 + 2304 * 7168                      # 18432 / 8 = 2304
LM_HEAD_PARAMS = 7168 * (163840 // 8)


def test_hand_sums_are_what_they_say():
    assert (KDA_PARAMS, MLA_PARAMS, MOE_PARAMS, EXPERT_PARAMS) == (56_250_368, 42_270_720, 74_317_824, 33_030_144)


@pytest.fixture(scope="module")
def step():
    return step_costs(SimModel(), Parallel(tp=8, moe="ep"), STEP)


def test_weights_read_by_one_decode_step(step):
    assert step["kda_proj"].weight_bytes == 69 * KDA_PARAMS * BF16
    assert step["mla_proj"].weight_bytes + step["mla_decode"].weight_bytes == 24 * MLA_PARAMS * BF16
    non_expert = sum(step[k].weight_bytes for k in ("moe_router", "moe_shared", "moe_latent"))
    assert non_expert == 92 * MOE_PARAMS * BF16
    # 112 experts per rank; a token picks a given one with probability 16/896; four tokens
    touched = 112 * (1 - (880 / 896) ** 4)
    assert step["moe_experts"].weight_bytes == pytest.approx(92 * touched * EXPERT_PARAMS * (0.5 + 1 / 32))
    assert step["moe_experts"].weight_bytes / 92 / (EXPERT_PARAMS * MXFP4_BYTES) == pytest.approx(7.79, abs=0.01)
    assert step["dense_ffn"].weight_bytes == DENSE_PARAMS * BF16
    assert step["lm_head"].weight_bytes == LM_HEAD_PARAMS * BF16


def test_latent_cache_bytes_per_token(step):
    """576 bf16 values per token per MLA layer, whole on every rank: each request reads its 1000 cached tokens and
    the new one, and writes the new one."""
    per_token = 576 * 2
    assert step["mla_decode"].cache_bytes == 24 * R * (C + 1 + 1) * per_token
    assert step["mla_prefill"].cache_bytes == 0


def test_kda_state_bytes_per_request(step):
    """12 heads x 128 x 128 fp32 per request per KDA layer on a rank (786,432 B), read and written; the short conv's
    state, 3 rows of 3 x 1536 bf16 channels (27,648 B), read and written."""
    state, conv = 12 * 128 * 128 * 4, 3 * 3 * 1536 * 2
    assert (state, conv) == (786_432, 27_648)
    assert step["kda_recurrent"].cache_bytes == 69 * R * 2 * (state + conv)
    assert step["kda_prefill"].cache_bytes == 0


def test_decode_flops_by_hand(step):
    """KDA: 7·d² per head per token (decay, kᵀS, rank-1 update, Sᵀq) plus the conv's 2·4 per channel; MLA absorbed:
    scores over 576 and the sum over 512 per (query, key) pair per head, plus the two absorptions."""
    kda = R * (12 * 7 * 128 * 128 + 2 * 3 * 1536 * 4)
    assert step["kda_recurrent"].flops == 69 * kda
    pairs = C + 1
    mla = R * (2 * pairs * 12 * (576 + 512) + 2 * 12 * (128 * 512 + 512 * 128))
    assert step["mla_decode"].flops == 24 * mla
    assert step["kda_proj"].flops == 69 * 2 * R * KDA_PARAMS


def test_verify_keeps_one_state_and_a_longer_conv_window():
    """A verification of 3 drafts (4 tokens): the recurrent state is read and written once, the conv state holds 3 + 3
    rows (vLLM's shape at TP8 with 3 speculative tokens: (6, 4608))."""
    costs = step_costs(SimModel(), Parallel(), [Seq(4, C, "verify")])
    assert costs["kda_recurrent"].cache_bytes == 69 * 2 * (12 * 128 * 128 * 4 + 6 * 4608 * 2)
    assert costs["lm_head"].flops == 2 * 4 * LM_HEAD_PARAMS


FUSED = Mechanisms(fused_kda_decode=fused_kda_decode, fused_mla_norm=fused_mla_norm)


@pytest.mark.parametrize("act_bytes", [2, 4])
@pytest.mark.parametrize(("tokens", "heads", "head_dim", "conv_width"), [(1, 12, 128, 4), (4, 12, 128, 4),
                                                                         (37, 96, 128, 4), (3, 2, 16, 3)])
def test_the_stock_kda_decode_is_fusions_off_path(tokens, heads, head_dim, conv_width, act_bytes):
    # the simulator prices stock vLLM itself; fusion's traffic accounting of its off path is the second derivation
    sizes = (tokens, heads, head_dim, conv_width, act_bytes)
    assert stock_kda_decode(*sizes) == unfused("kda_decode", *sizes)
    assert fused_kda_decode(*sizes).kernels == 1


@pytest.mark.parametrize("act_bytes", [2, 4])
@pytest.mark.parametrize(("tokens", "q_lora", "kv_lora"), [(1, 1536, 512), (200, 1536, 512), (7, 64, 32)])
def test_the_stock_mla_norms_are_fusions_off_path(tokens, q_lora, kv_lora, act_bytes):
    sizes = (tokens, q_lora, kv_lora, act_bytes)
    assert stock_mla_norm(*sizes) == unfused("mla_norm", *sizes)
    assert fused_mla_norm(*sizes).kernels == 1


def test_fusion_on_fuses_the_kda_decode_of_a_step_that_only_decodes():
    """Off: conv, recurrence, copy, gated norm, copy (5 kernels); on: one. Each pass streams its inputs and outputs,
    so fusing drops the conv output (written and read: 2 x 4 x 4608 bf16), the recurrence output's trips
    through the copies and the norm (6 x 4 x 1536 bf16) and the recurrence's second read of the slot indices
    (4 int32): 147,472 B per layer. FLOPs and the state are the same."""
    off, on = step_costs(SimModel(), Parallel(), STEP), step_costs(SimModel(), Parallel(), STEP, FUSED)
    assert (off["kda_recurrent"].kernels, on["kda_recurrent"].kernels) == (69 * 5, 69 * 1)
    assert off["kda_recurrent"].bytes - on["kda_recurrent"].bytes == 69 * (
        2 * 4 * 4608 * 2 + 6 * 4 * 1536 * 2 + 4 * 4)
    assert on["kda_recurrent"].cache_bytes == off["kda_recurrent"].cache_bytes
    assert on["kda_recurrent"].flops == off["kda_recurrent"].flops
    # beside a prefill chunk vLLM runs its general path: the separate passes
    mixed = [Seq(512, 0, "prefill"), *STEP]
    assert step_costs(SimModel(), Parallel(), mixed, FUSED)["kda_recurrent"].kernels == 69 * 5


def test_fusion_on_normalises_the_mla_latents_in_one_pass():
    """Two RMSNorms (q over 1536, kv over 512 values per token) or one pass over both: the same bytes streamed,
    one launch fewer per MLA layer, in every step."""
    off, on = step_costs(SimModel(), Parallel(), STEP), step_costs(SimModel(), Parallel(), STEP, FUSED)
    assert (off["mla_norm"].kernels, on["mla_norm"].kernels) == (24 * 2, 24 * 1)
    assert off["mla_norm"].bytes == on["mla_norm"].bytes == 24 * (2 * R * 2048 * 2 + 2048 * 2)


def test_prefill_is_compute_bound_and_decode_is_not():
    peak, bandwidth = 2.5e15, 8e12
    model = SimModel()
    prefill = step_costs(model, Parallel(), [Seq(8192, 0, "prefill")])
    decode = step_costs(model, Parallel(), STEP)
    pf, dc = Cost.total(prefill.values()), Cost.total(decode.values())
    assert pf.flops / pf.bytes > peak / bandwidth > dc.flops / dc.bytes
    assert kernel_time(pf, peak, bandwidth, 1.0, 1.0) == pf.flops / peak
    assert kernel_time(dc, peak, bandwidth, 1.0, 1.0) == dc.bytes / bandwidth
    with pytest.raises(ValueError, match="efficiencies"):
        kernel_time(dc, peak, bandwidth, 0.0, 1.0)


def test_weights_per_rank_and_the_mtp_pass():
    """69 KDA, 24 MLA + the MTP layer's, 92 MoE + the MTP layer's (112 experts each on a rank), the dense FFN,
    embedding and LM head, the MTP projection: about 207 GB per rank, 183 GB of it experts."""
    hand = (69 * KDA_PARAMS * BF16 + 25 * MLA_PARAMS * BF16 + 93 * MOE_PARAMS * BF16
            + 93 * 112 * EXPERT_PARAMS * (0.5 + 1 / 32) + DENSE_PARAMS * BF16 + 2 * LM_HEAD_PARAMS * BF16
            + 2 * 7168 * 7168 * BF16)
    assert weights_per_rank(SimModel(), Parallel()) == pytest.approx(hand)
    assert hand / 1e9 == pytest.approx(207.4, abs=0.1)
    mtp = mtp_costs(SimModel(), Parallel(), STEP)
    assert mtp["mtp_proj"].weight_bytes == 2 * 7168 * 7168 * BF16
    assert mtp["mtp_lm_head"].flops == 2 * R * LM_HEAD_PARAMS


@pytest.mark.parametrize(("field", "value", "message"), [
    ("vocab_size", 0, "SimModel.vocab_size: invalid value 0"), ("kv_bytes", 0, "SimModel.kv_bytes: invalid value 0"),
])
def test_bad_model_values_are_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        SimModel(**{field: value})


def test_bad_parallelism_and_steps_are_named():
    with pytest.raises(ValueError, match=r"Parallel.moe: invalid value 'dp'"):
        Parallel(moe="dp")
    with pytest.raises(ValueError, match=r"Parallel.tp: invalid value 5; valid: a divisor of kda_heads \(96\)"):
        step_costs(SimModel(), Parallel(tp=5), STEP)
    with pytest.raises(ValueError, match=r"Seq: a decode computes 1 token, got 2"):
        Seq(2, 0, "decode")


def test_moe_dedup_sp_is_the_packages_sequence_parallel_layer_at_tp8():
    """sp at TP8 over 1,024 tokens (128 a rank) against moe_dedup's own per-rank counts (`counts.py`, bf16): the
    GEMMs' and experts' FLOPs, and the bytes a rank puts on the ring (the dispatch's routing ids left out)."""
    from opts.moe_dedup.counts import IDS_BYTES, mode_counts

    m, tokens, top_k = SimModel(), 1024, SimModel().spec.experts_per_token
    sp = moe_layer(m, Parallel(tp=8), [Seq(tokens, 0, "prefill")], Mechanisms(sequence_parallel_moe=True))
    parts = mode_counts("sp", tp=8, num_tokens=tokens, scope="layer").parts
    assert sp["moe_router"].flops == parts["router"].flops
    assert sp["moe_shared"].flops == parts["shared"].flops
    assert sp["moe_latent"].flops == parts["down"].flops + parts["up"].flops
    assert sp["moe_experts"].flops == pytest.approx(parts["experts"].flops, rel=1e-12)
    ring = 7 / 8 * sum(c.gather_bytes for c in sp.values())            # each gather or scatter through a ring of 8
    ids = tokens * top_k * (IDS_BYTES + 2) * 7 / 8
    assert ring == pytest.approx(sum(p.comm_bytes for p in parts.values()) - ids, rel=1e-12)
    assert sum(c.gathers for c in sp.values()) == 3 and sum(c.collectives for c in sp.values()) == 0   # 2 + 1 scatter
    off = moe_layer(m, Parallel(tp=8), [Seq(tokens, 0, "prefill")])
    assert sp["moe_shared"].weight_bytes == 8 * off["moe_shared"].weight_bytes   # every rank holds the whole shared MLP


def test_routing_skew_touches_fewer_experts_and_zero_is_the_uniform_formula():
    # K3: 896 experts, top-16; a 24-token decode step (6 requests verifying 3 drafts)
    uniform = expected_experts(896, 16, 24)
    assert uniform == 896 * (1.0 - (1.0 - 16 / 896) ** 24)
    assert expected_experts(896, 16, 24, 0.0) == uniform
    assert expected_experts(896, 16, 1, 0.6) == pytest.approx(16.0, rel=1e-12)     # one token: its 16 picks
    skewed = [expected_experts(896, 16, 24, s) for s in (0.2, 0.4, 0.6)]
    assert uniform > skewed[0] > skewed[1] > skewed[2] == pytest.approx(0.86 * uniform, abs=0.01 * uniform)
    assert expected_experts(896, 16, 100_000, 0.6) == pytest.approx(896, rel=1e-3)  # a long prefill reads them all
    with pytest.raises(ValueError, match=r"backend.routing_skew: 0.9 gives the most popular of 896 experts a "
                                         r"per-token rate of 1\.\d\d >= 1 at top-16"):
        expected_experts(896, 16, 24, 0.9)


def test_routing_skew_lowers_a_decode_steps_expert_reads():
    skewed = SimModel(routing_skew=0.6)
    step = [Seq(4, C, "verify") for _ in range(6)]
    plain, fewer = step_costs(SimModel(), Parallel(), step), step_costs(skewed, Parallel(), step)
    assert fewer["moe_experts"].weight_bytes < 0.9 * plain["moe_experts"].weight_bytes
    assert fewer["moe_experts"].flops == plain["moe_experts"].flops        # the same token-expert pairs
