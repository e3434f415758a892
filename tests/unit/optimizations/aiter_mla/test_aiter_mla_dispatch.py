"""The dispatch decision and the AITER adapter's pure parts (its kernel call cannot run without ROCm)."""

from __future__ import annotations

import functools

import pytest
import torch

from opts.aiter_mla import AiterMLAConfig, aiter, make_decode, make_inputs, naive, select_backend, split_kv
from opts.aiter_mla.dispatch import aiter_decode
from opts.aiter_mla.mla import K3_TP8, absorb_query


@pytest.mark.parametrize(("mode", "on_backend", "device", "is_hip", "has_aiter", "expected"), [
    ("off", "auto", "cuda", True, True, "naive"),
    ("off", "aiter", "cpu", False, False, "naive"),
    ("on", "auto", "cpu", False, False, "split_kv"),
    ("on", "auto", "cpu", False, True, "split_kv"),
    ("on", "auto", "cuda", False, True, "split_kv"),     # NVIDIA: no AITER
    ("on", "auto", "cuda", True, False, "split_kv"),     # ROCm without amd-aiter
    ("on", "auto", "cuda", True, True, "aiter"),         # ROCm with amd-aiter
    ("on", "split_kv", "cuda", True, True, "split_kv"),  # asked for the portable path
    ("on", "aiter", "cuda", True, True, "aiter"),
])
def test_select_backend(mode: str, on_backend: str, device: str, is_hip: bool, has_aiter: bool,
                        expected: str) -> None:
    assert select_backend(mode, on_backend, device, is_hip, has_aiter) == expected


@pytest.mark.parametrize(("device", "is_hip", "has_aiter"), [("cpu", False, True), ("cuda", False, True),
                                                             ("cuda", True, False)])
def test_asking_for_aiter_where_it_cannot_run_is_an_error(device: str, is_hip: bool, has_aiter: bool) -> None:
    with pytest.raises(ValueError, match=r"on_backend='aiter' needs a ROCm GPU.*valid choices here: auto, split_kv"):
        select_backend("on", "aiter", device, is_hip, has_aiter)


def test_make_decode_on_this_cpu() -> None:
    assert make_decode(AiterMLAConfig(mode="off"), "cpu") is naive.decode
    on = make_decode(AiterMLAConfig(mode="on", tile_tokens=256, stage_bytes=1 << 20), "cpu")
    assert isinstance(on, functools.partial) and on.func is split_kv.decode
    assert on.keywords["tiling"] == split_kv.Tiling(256, 1 << 20)
    default = make_decode(AiterMLAConfig(mode="on"), "cpu")
    assert default.keywords["tiling"] == split_kv.default_tiling("cpu")


@pytest.mark.skipif(aiter.is_available(), reason="amd-aiter is installed here")
def test_aiter_path_fails_loudly_without_aiter() -> None:
    with pytest.raises(ValueError, match="on_backend='aiter'"):
        make_decode(AiterMLAConfig(mode="on", on_backend="aiter"), "cpu")
    inputs = make_inputs([8], block_size=4, dtype=torch.float32)
    with pytest.raises(ModuleNotFoundError, match="aiter"):
        aiter_decode(*inputs.args())


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
    plain = naive.latent_attention(q, inputs.kv_cache, inputs.block_table, lens, scale, rank)
    via_padding = naive.latent_attention(padded, inputs.kv_cache, inputs.block_table, lens, scale, rank)[:, :12]
    torch.testing.assert_close(via_padding, plain, rtol=0, atol=0)
