"""kda_overlap on ROCm: vLLM runs `vllm/models/kimi_k3/amd/kda.py` there, whose prefill kernel `chunk_kda_prefill`
reads and writes the paged state cache itself and writes the prefix cache's checkpoints. The patch targets exist
in vLLM 0.32 and the wrappers take their arguments; `_forward` reads nothing of the verification between its call
and the prefill kernel; the off kernel in ROCm's form equals the CUDA form's gathered call; on equals off within
1e-5 (fp32, the package's tolerance), its checkpoint included, in one packed pass; streams runs the verification
on a side stream (the CPU's, in order) and equals off bit for bit."""

from __future__ import annotations

import contextlib
import inspect
import re
from types import SimpleNamespace

import pytest
import torch
from kda_vllm_cases import (
    CHECKPOINT_ROWS,
    HAS_INITIAL,
    PREFIX,
    mixed_case,
    mixed_context,
    on_stream,
    serial_forward_rocm,
)

from opts.kda_overlap import KdaOverlapConfig
from opts.kda_overlap import vllm as setting
from opts.kda_overlap.in_vllm import forward as overlap
from opts.kda_overlap.in_vllm import kernels as vllm_kernels
from opts.kda_overlap.step import side_stream

TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.fixture(scope="module")
def vllm():
    from ablations.backends.vllm.launch.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    return pytest.importorskip("vllm")


def rocm_verify_off(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                    ssm_state_indices, num_accepted_tokens=None, uniform_sequence_length=None, out=None,
                    fuse_gate=None):
    """Off in amd/kda.py's signature: the CPU verification kernel (the launch hint changes nothing)."""
    return vllm_kernels.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state,
                                            cu_seqlens, ssm_state_indices, num_accepted_tokens, out, fuse_gate)


OFF = SimpleNamespace(fused_recurrent_kda=rocm_verify_off, chunk_kda_prefill=vllm_kernels.chunk_kda_prefill)


def stock_forward():
    from ablations.backends.vllm.in_vllm.patches import stock

    return stock(setting.ROCM_FORWARD_TARGET)


def test_every_rocm_target_exists_in_vllm_and_the_wrappers_take_its_arguments(vllm):
    from vllm.models.kimi_k3.amd import kda as amd_kda

    from ablations.backends.vllm.in_vllm.patches import resolve

    for target in (setting.ROCM_FORWARD_TARGET, setting.ROCM_VERIFY_TARGET, setting.ROCM_PREFILL_TARGET):
        owner, attr = resolve(target)
        assert callable(getattr(owner, attr))
    for stock, ours in ((amd_kda.fused_recurrent_kda, overlap.defer_verify_rocm(None)),
                        (amd_kda.fused_recurrent_kda, rocm_verify_off),
                        (amd_kda.chunk_kda_prefill, overlap.streamed_prefill_rocm(None)),
                        (amd_kda.chunk_kda_prefill, overlap.packed_prefill_rocm(None)),
                        (amd_kda.chunk_kda_prefill, vllm_kernels.chunk_kda_prefill)):
        names = list(inspect.signature(ours, follow_wrapped=False).parameters)
        assert names == list(inspect.signature(stock).parameters)


def test_rocm_forward_reads_no_verification_output_before_the_prefill_kernel(vllm):
    """What deferring relies on (amd/kda.py:496-640): the verification call comes first; between it and the
    prefill kernel nothing reads its output or the states it writes; the second `fused_recurrent_kda` there is
    the decode peel, which a step with speculative rows skips (`split_non_spec`)."""
    source = inspect.getsource(stock_forward())
    verify = source.index("core_attn_out_spec, _ = fused_recurrent_kda(")
    prefill = source.index("= chunk_kda_prefill(")
    between = source[source.index(")\n", verify):prefill]
    assert verify < prefill
    assert not re.search(r"\b(core_attn_out_spec|spec_out)\b", between)
    assert between.count("fused_recurrent_kda(") == 1
    assert "split_non_spec = spec_sequence_masks is None and" in between
    # the decode peel's initial state; the checkpoint's destination (the prefill slots' rows)
    assert re.findall(r"(?<!\w)recurrent_state\b[^\n]*", between) == ["recurrent_state,", "recurrent_state"]
    assert source.index("merged.index_copy_(1, spec_token_indx, core_attn_out_spec)") > prefill


def test_the_rocm_off_kernel_is_the_gathered_call_and_its_checkpoint_the_state_after_64_tokens():
    case = mixed_case(seed=3)
    cache = case.cache.clone()
    rocm = SimpleNamespace(fused_recurrent_kda=lambda **kw: (None, None), chunk_kda_prefill=OFF.chunk_kda_prefill)
    case.cache[CHECKPOINT_ROWS] = float("nan")
    _, got = serial_forward_rocm(case, rocm)
    h0 = torch.where(torch.tensor(HAS_INITIAL).view(-1, 1, 1, 1), cache[case.prefill_slots],
                     torch.zeros_like(cache[case.prefill_slots]))
    want, final = vllm_kernels.chunk_kda_with_fused_gate(**case.prefill, initial_state=h0, output_final_state=True,
                                                         use_qk_l2norm_in_kernel=True)
    assert torch.equal(got, want)
    torch.testing.assert_close(case.cache[case.prefill_slots], final, **TOL)
    head = {**case.prefill, "cu_seqlens": torch.tensor([0, 64], dtype=torch.int32)}
    for name in ("q", "k", "v", "raw_g", "raw_beta"):
        head[name] = case.prefill[name][:, :64]
    _, at_64 = vllm_kernels.chunk_kda_with_fused_gate(**head, initial_state=h0[:1], output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(case.cache[CHECKPOINT_ROWS[0]], at_64[0], **TOL)
    assert torch.isnan(case.cache[CHECKPOINT_ROWS[1:]]).all()      # sequences without a checkpoint write none


def test_streams_on_rocm_run_the_verification_on_a_side_stream_and_equal_off_exactly(vllm, monkeypatch):
    # the plumbing (which kernel on which stream, the same kernels as off): the CPU's streams run in order, so a
    # race between them can only show on a GPU (node-check)
    calls, seen = [], []
    real = overlap.streamed_step
    monkeypatch.setattr(overlap, "streamed_step", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ops = SimpleNamespace(
        fused_recurrent_kda=overlap.defer_verify_rocm(on_stream(OFF.fused_recurrent_kda, seen, "verify")),
        chunk_kda_prefill=overlap.streamed_prefill_rocm(on_stream(OFF.chunk_kda_prefill, seen, "prefill")))
    forward = overlap.overlap_forward(lambda self, c: serial_forward_rocm(c, ops), 64, rocm=True)
    off, on = mixed_case(seed=12), mixed_case(seed=12)
    rocm_layer = SimpleNamespace(prefix=PREFIX)        # amd/kda.py's layer: no prefill-backend switch to check
    with mixed_context(3, 4):
        want = serial_forward_rocm(off, OFF)
        got = forward(rocm_layer, on)
    assert calls == [1]
    main, side = torch.cpu.current_stream(), side_stream(torch.device("cpu"))
    assert [name for name, _ in seen] == ["verify", "prefill"]
    assert seen[0][1] is side is not main and seen[1][1] is main
    for a, b in zip((*got, on.cache), (*want, off.cache), strict=True):
        assert not torch.isnan(a).any() and torch.equal(a, b)
    seen.clear()
    with mixed_context(3, 0):
        forward(rocm_layer, mixed_case(seed=12))
    assert calls == [1] and [(name, s is main) for name, s in seen] == [("verify", True), ("prefill", True)]


def test_streams_on_rocm_patch_amd_kda_and_count_the_two_stream_step():
    patches = setting.vllm_setting(KdaOverlapConfig(mode="streams"), "rocm").patches
    assert [p.target for p in patches] == [setting.ROCM_FORWARD_TARGET, setting.ROCM_VERIFY_TARGET,
                                           setting.ROCM_PREFILL_TARGET, setting.STREAMED_TARGET]
    assert [p.counter for p in patches] == [None, None, None, setting.STREAMED_COUNTER]


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_on_on_rocm_equals_off_with_its_checkpoint_in_one_packed_pass(vllm, monkeypatch, chunk_size):
    calls = []
    real = overlap.packed_step_rocm
    monkeypatch.setattr(overlap, "packed_step_rocm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    ops = SimpleNamespace(fused_recurrent_kda=overlap.defer_verify_rocm(OFF.fused_recurrent_kda),
                          chunk_kda_prefill=overlap.packed_prefill_rocm(OFF.chunk_kda_prefill))
    forward = overlap.overlap_forward(lambda self, c: serial_forward_rocm(c, ops), chunk_size, rocm=True)
    off, on = mixed_case(seed=14), mixed_case(seed=14)
    for case in (off, on):
        case.cache[CHECKPOINT_ROWS] = float("nan")
    with mixed_context(3, 4):
        want = serial_forward_rocm(off, OFF)
        got = forward(SimpleNamespace(prefix=PREFIX), on)
    assert calls == [1]
    assert not torch.isnan(on.cache[CHECKPOINT_ROWS[0]]).any() and torch.isnan(on.cache[CHECKPOINT_ROWS[1:]]).all()
    keep = [r for r in range(on.cache.shape[0]) if r not in CHECKPOINT_ROWS[1:]]
    for a, b in zip((*got, on.cache[keep]), (*want, off.cache[keep]), strict=True):
        assert not torch.isnan(a).any()
        torch.testing.assert_close(a, b, **TOL)
    with mixed_context(3, 0):       # not a mixed step: off exactly
        plain_off, plain_on = mixed_case(seed=14), mixed_case(seed=14)
        for a, b in zip((*forward(SimpleNamespace(prefix=PREFIX), plain_on), plain_on.cache),
                        (*serial_forward_rocm(plain_off, OFF), plain_off.cache), strict=True):
            assert torch.equal(a, b)
    assert calls == [1]


def test_on_on_rocm_patches_amd_kda_and_counts_the_packed_pass():
    patches = setting.vllm_setting(KdaOverlapConfig(mode="on"), "rocm").patches
    assert [p.target for p in patches] == [setting.ROCM_FORWARD_TARGET, setting.ROCM_VERIFY_TARGET,
                                           setting.ROCM_PREFILL_TARGET, setting.PACKED_ROCM_TARGET]
    assert [p.counter for p in patches] == [None, None, None, setting.PACKED_COUNTER]
    assert patches[3].wrap(overlap.packed_step_rocm) is overlap.packed_step_rocm


def test_a_checkpoint_the_rocm_kernel_skips_is_skipped_and_its_cache_arguments_are_checked():
    # as amd/ops/kda_chunk.py:32-38: the null block (row 0) and a negative row write nothing; an offset off the
    # 64-token grid or past its sequence neither
    offsets = torch.tensor([64, 64, 64, 40, 128], dtype=torch.int32)
    rows = torch.tensor([5, 0, -1, 7, 8], dtype=torch.int32)
    assert vllm_kernels.checkpoint_rows(offsets, rows, (70, 70, 70, 70, 70)) == [(0, 64, 5)]
    assert vllm_kernels.checkpoint_rows(offsets[:1], None, (64,)) == [(0, 64, 0)]      # staging: row = sequence
    case = mixed_case(seed=4)
    with pytest.raises(ValueError, match="state_cache replaces initial_state/output_final_state"):
        OFF.chunk_kda_prefill(**case.prefill, state_cache=case.cache, state_indices=case.prefill_slots,
                              has_initial_state=torch.tensor(HAS_INITIAL), output_final_state=True)
    call = overlap.MixedCall(64, verify={})
    call.out = torch.empty(0)
    with pytest.raises(ValueError, match="state_cache needs state_indices and has_initial_state"):
        overlap.packed_step_rocm(call, **case.prefill, state_cache=case.cache)
