"""The node as vLLM 0.32 runs a step on it: the all-reduce algorithm chosen by payload, world size and device, each
priced by its own figures; graph replays against eager launches; FLOPs at the peak of the precision a kernel
computes in; the weight formats and MLA decode kernel stock vLLM runs on each platform."""

from __future__ import annotations

import dataclasses

import pytest

from ablations.backends.sim.collectives import allreduce_seconds, choose, gather_seconds
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Cost, Parallel, Seq, SimModel
from ablations.backends.sim.graphs import EAGER, Graphs, is_splitting
from ablations.backends.sim.served import graphs, served_model
from ablations.backends.sim.step_model import StepModel, exact_costs, probe_steps
from ablations.backends.sim.timing import step_time
from ablations.config import compose_app

KiB, MiB = 1024, 1024 * 1024
TOKEN = 7168 * 2                # one token's hidden state in bf16: an attention all-reduce's payload per token


def node(name: str):
    return compose_app([f"hardware={name}"]).hardware


@pytest.mark.parametrize(("hardware", "expected"), [
    # ROCm, AITER off: vLLM's custom all-reduce (one stage below 256 KiB, two up to 8 MiB), then RCCL
    ("mi355x_x8", [(1, "ar_1stage"), (256 * KiB - 16, "ar_1stage"), (256 * KiB, "ar_2stage"),
                   (8 * MiB - 16, "ar_2stage"), (8 * MiB, "ccl"), (117 * MiB, "ccl")]),
    # B300 (10.3): FlashInfer's mnnvl all-reduce below 64 MiB comes first, then NCCL
    ("b300_x8", [(1, "flashinfer"), (4 * MiB, "flashinfer"), (64 * MiB - 16, "flashinfer"), (64 * MiB, "ccl")]),
    # H200 (9.0): FlashInfer below 0.5 MiB, symmetric memory below 64 MiB, then NCCL
    ("h200_x8", [(1, "flashinfer"), (MiB // 2, "symm_mem"), (64 * MiB - 16, "symm_mem"), (64 * MiB, "ccl")]),
])
def test_the_all_reduce_is_the_one_vllm_picks_for_its_payload(hardware, expected):
    hw = node(hardware)
    assert [(size, choose(hw, 8, size)) for size, _ in expected] == expected
    assert choose(hw, 4, 1) == "ccl"                 # no vLLM limits modelled at 4 ranks: NCCL / RCCL
    with pytest.raises(ValueError, match=r"tp=1: one rank all-reduces nothing"):
        choose(hw, 1, 1)


def test_k3_decode_tokens_cross_the_one_stage_limit_at_19():
    """At TP8 the custom all-reduce runs one stage up to 18 tokens of K3's hidden state (18 · 14,336 B < 256 KiB),
    two from 19; each priced by its own latency and bus bandwidth."""
    hw = node("mi355x_x8")
    assert choose(hw, 8, 18 * TOKEN) == "ar_1stage" and choose(hw, 8, 19 * TOKEN) == "ar_2stage"
    one, two = allreduce_seconds([18 * TOKEN, 19 * TOKEN], 8, hw)
    assert one == pytest.approx(hw.ar_1stage_us * 1e-6 + 1.75 * 18 * TOKEN / (hw.ar_1stage_busbw_gb_s * 1e9))
    assert two == pytest.approx(hw.ar_2stage_us * 1e-6 + 1.75 * 19 * TOKEN / (hw.ar_2stage_busbw_gb_s * 1e9))
    assert list(allreduce_seconds([0.0, 1e6], 1, hw)) == [0.0, 0.0]
    assert gather_seconds(8e6, 2, 8, hw) == pytest.approx(2 * hw.ccl_us * 1e-6 + 7 / 8 * 8e6 / (hw.ccl_busbw_gb_s
                                                                                                 * 1e9))
    missing = dataclasses.replace(hw, ar_2stage_busbw_gb_s=0.0, sources={
        k: v for k, v in hw.sources.items() if k != "ar_2stage_busbw_gb_s"})
    with pytest.raises(ValueError, match=r"vLLM all-reduces with ar_2stage here and ar_2stage_us / "
                                         r"ar_2stage_busbw_gb_s are not given"):
        allreduce_seconds(MiB, 8, missing)
    with pytest.raises(ValueError, match=r"ar_1stage_busbw_gb_s: 600 is above the link's 537.6 GB/s"):
        dataclasses.replace(hw, ar_1stage_busbw_gb_s=600.0)


def test_a_step_all_reduces_once_per_layer_output_and_moe_latent():
    """K3's target pass: 69 KDA + 24 MLA + 92 shared-expert + 1 dense all-reduces of the hidden state and 92 of the
    MoE latent, each sized by the step's tokens: a 4-request verification of 4 tokens on MI355X all one stage."""
    hw = node("mi355x_x8")
    model = StepModel(SimModel(), Parallel(), hw, 0)
    assert model._allreduces == [(10, 92.0, 3584 * 2.0), (10, 186.0, 7168 * 2.0)]
    seqs = [Seq(1, 1000, "decode")] * 16
    t = model.exact_step(seqs).comm_s
    want = 186 * allreduce_seconds(16 * TOKEN, 8, hw) + 92 * allreduce_seconds(16 * TOKEN / 2, 8, hw)
    assert t == pytest.approx(float(want))


def test_graphs_decide_how_each_step_launches():
    g = Graphs("full_and_piecewise", max_tokens=512, target_pieces=94, mtp_pieces=2)
    assert [g.step_mode(16, False), g.step_mode(16, True), g.step_mode(513, False)] == ["full", "piecewise", "eager"]
    rocm = dataclasses.replace(g, mode="full_decode_only")
    assert [rocm.step_mode(16, False), rocm.step_mode(16, True)] == ["full", "eager"]
    assert EAGER.step_mode(1, False) == "eager"
    assert (g.replays("full", 3), g.replays("piecewise", 3), g.replays("eager", 3)) == (4, 94 + 6, 0)
    assert is_splitting("later_mtp_mla_decode") and is_splitting("kda_prefill") and not is_splitting("kda_proj")
    with pytest.raises(ValueError, match=r"cudagraph_mode: invalid value 'always'"):
        Graphs("always")


@pytest.mark.parametrize("hardware", ["mi355x_x8", "b300_x8"])
def test_a_decode_replays_one_graph_per_pass_a_prefill_runs_the_platforms_way(hardware):
    """A decode step: 1 + K graph replays and a node's cost per kernel; a step that prefills: eager on ROCm (a
    launch per kernel), piecewise on CUDA (a replay per piece, attention launched eagerly). Fast == exact."""
    hw = node(hardware)
    m = served_model(SimBackendConfig(), SimModel(), hw.platform)
    g = graphs(SimBackendConfig(), m, hw, 3)
    model, eager = StepModel(m, Parallel(), hw, 3, graphs=g), StepModel(m, Parallel(), hw, 3)
    decode = [Seq(4, 20000, "verify")] * 4
    kernels = sum(c.kernels for c in exact_costs(m, Parallel(), decode, 3).values())
    assert model.exact_step(decode).launch_s == pytest.approx(4 * hw.graph_launch_us * 1e-6
                                                              + kernels * hw.graph_node_us * 1e-6)
    assert eager.exact_step(decode).launch_s == pytest.approx(kernels * hw.launch_us * 1e-6)
    mixed = [Seq(256, 0, "prefill"), *decode]
    costs = exact_costs(m, Parallel(), mixed, 3)
    attention = sum(c.kernels for n, c in costs.items() if is_splitting(n))
    rest = sum(c.kernels for n, c in costs.items() if not is_splitting(n))
    if hw.platform == "rocm":
        want = (attention + rest) * hw.launch_us
    else:
        want = (94 + 3 * 2) * hw.graph_launch_us + attention * hw.launch_us + rest * hw.graph_node_us
    assert model.exact_step(mixed).launch_s == pytest.approx(want * 1e-6)
    big = [Seq(4, 20000, "verify")] * (hw.capture_ceiling // 4 + 1)          # past the largest captured batch
    assert model.exact_step(big).launch_s == pytest.approx(eager.exact_step(big).launch_s)
    for seqs in [decode, mixed, big, *probe_steps(seed=5, count=12)]:
        assert model.time(seqs) == pytest.approx(model.exact_time(seqs), rel=1e-9)


def test_flops_run_at_the_peak_of_the_precision_the_kernel_computes_in():
    hw, p = node("b300_x8"), Parallel()
    costs = {"moe_experts": Cost(flops=1e15)}
    bf16 = step_time(costs, hw, p).kernels_s
    fp8 = step_time(costs, hw, p, precisions={"moe": "fp8"}).kernels_s
    assert bf16 == pytest.approx(1e15 / (2250e12 * hw.efficiency["moe"]))
    assert fp8 == pytest.approx(1e15 / (4500e12 * hw.efficiency["moe"]))
    with pytest.raises(ValueError, match=r"hardware h200_x8: a kernel computes in fp4 and peak_fp4_tflops is not "
                                         r"given"):
        step_time(costs, node("h200_x8"), p, precisions={"moe": "fp4"})


def test_each_platform_serves_k3_in_vllms_formats_and_mla_kernel():
    """ROCm: AITER's MXFP4 W4A16 experts (BF16 compute); B300: FlashInfer's MXFP4 x MXFP8 (FP8 compute), and its
    MLA decode as FLASHINFER_MLA's own kernel class; every other layer BF16, the cache bf16 (vLLM's auto)."""
    backend = SimBackendConfig()
    rocm, cuda = (served_model(backend, SimModel(), platform) for platform in ("rocm", "cuda"))
    assert (rocm.expert_precision, cuda.expert_precision) == ("bf16", "fp8")
    assert rocm.expert_bytes == cuda.expert_bytes == SimModel().expert_bytes
    assert rocm.weight_bytes == cuda.weight_bytes == rocm.kv_bytes == 2.0
    fp8 = served_model(dataclasses.replace(backend, kv_dtype="fp8", weights="fp8"), SimModel(), "rocm")
    assert (fp8.kv_bytes, fp8.weight_bytes, fp8.gemm_precision) == (1.0, 1.0, "fp8")
    with pytest.raises(ValueError, match=r"backend.experts: invalid value 'int3'"):
        SimBackendConfig(experts="int3")
    b300 = node("b300_x8")
    decode = {"mla_decode": Cost(weight_bytes=8e9, kernels=1)}
    assert step_time(decode, b300, Parallel()).kernels_s == pytest.approx(1e-3 / b300.efficiency[
        "attention_blackwell"])
    assert b300.stock_classes["mla_decode"] == "attention_blackwell"
