"""The CPU MLA pieces against vLLM: its CPU MLA cache write (`CPUMLAImpl.do_kv_cache_update`,
v1/attention/backends/mla/cpu_mla.py:195-220), its CPU SDPA context chunk (mla/prefill/cpu_sdpa.py:117-137), the
epilogues' contract (models/kimi_k3/nvidia/ops/fused_mla_key_concat_kv_cache.py) and the Triton q/kv RMSNorm
(models/common/ops/fused_qk_rmsnorm.py:56-91), transcribed below."""

from __future__ import annotations

import types

import pytest
import torch

from ablations.backends.vllm.in_vllm import patches as patching
from ablations.backends.vllm.in_vllm.cpu import mla

T, HEADS, NOPE, ROPE, LATENT = 5, 3, 4, 2, 6


def latent_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kv_c, k_pe = torch.randn(T, LATENT, generator=g), torch.randn(T, 1, ROPE, generator=g)
    slots = torch.tensor([5, 6, -1, 0, 15])
    return kv_c, k_pe, slots


def vllm_cache_write(kv_c, k_pe, slots):
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLAImpl

    cache = torch.full((4, 4, LATENT + ROPE), 7.0)
    CPUMLAImpl.do_kv_cache_update(None, kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0))
    return cache


def test_prefill_epilogue_concats_the_key_and_writes_the_cache_like_vllm_cpu_mla(vllm):
    kv_c, k_pe, slots = latent_inputs()
    k_nope = torch.randn(T, HEADS, NOPE)
    cache = torch.full((4, 4, LATENT + ROPE), 7.0)
    k = mla.fused_mla_key_concat_kv_cache_insert(None, k_nope, k_pe, kv_c, cache, slots)
    assert torch.equal(cache, vllm_cache_write(kv_c, k_pe, slots))
    assert k.shape == (T, HEADS, NOPE + ROPE) and k.is_contiguous()
    assert torch.equal(k, torch.cat([k_nope, k_pe.expand(T, HEADS, ROPE)], dim=-1))


def test_decode_epilogue_returns_the_latent_query_and_writes_the_cache_like_vllm_cpu_mla(vllm):
    kv_c, k_pe, slots = latent_inputs(1)
    ql_nope, q_pe = torch.randn(T, HEADS, LATENT), torch.randn(T, HEADS, ROPE)
    cache = torch.full((4, 4, LATENT + ROPE), 7.0)
    q = mla.fused_mla_decode_q_concat_kv_cache_insert(ql_nope, q_pe, kv_c, k_pe[:, 0], cache, slots)
    assert torch.equal(cache, vllm_cache_write(kv_c, k_pe, slots))
    assert torch.equal(q, torch.cat([ql_nope, q_pe], dim=-1))


def test_context_key_concat_takes_strided_halves():
    kv = torch.randn(T, HEADS, NOPE + 5)
    workspace = torch.randn(T, LATENT + ROPE)
    k = mla.fused_mla_kv_concat(kv[..., :NOPE], workspace[:, LATENT:])
    assert k.is_contiguous() and torch.equal(k[..., :NOPE], kv[..., :NOPE])
    assert torch.equal(k[..., NOPE:], workspace[:, None, LATENT:].expand(T, HEADS, ROPE))


def test_epilogues_refuse_rope_and_fp8():
    with pytest.raises(NotImplementedError, match="RoPE"):
        mla.fused_mla_key_concat_kv_cache_insert(None, torch.zeros(1, 1, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                                                 torch.zeros(1, 1, 4), torch.zeros(1, dtype=torch.long),
                                                 positions=torch.zeros(1, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="fp8"):
        mla.fused_mla_decode_q_concat_kv_cache_insert(None, None, None, None, None, None, ds_mla=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q_kv_rmsnorm_is_vllms_rms_norm_twice(vllm, dtype):
    """What vLLM runs for an RMSNorm on CPU (`ir.ops.rms_norm`, native ops), bit for bit; row-strided inputs.
    (Triton's fused kernel rounds once at the end: in bf16 it differs by an ulp; that is the fusion toggle's.)"""
    from vllm import ir

    g = torch.Generator().manual_seed(2)
    qr = torch.randn(3, 12, generator=g).to(dtype)[:, :8]
    kv = torch.randn(3, 4, generator=g).to(dtype)
    w1, w2 = (torch.rand(8, generator=g) + 0.5).to(dtype), (torch.rand(4, generator=g) + 0.5).to(dtype)
    a, b = mla.fused_q_kv_rmsnorm(qr, kv, w1, w2, 1e-6)
    assert a.dtype == b.dtype == dtype
    torch.testing.assert_close(a, ir.ops.rms_norm(qr, w1, 1e-6), atol=0, rtol=0)
    torch.testing.assert_close(b, ir.ops.rms_norm(kv, w2, 1e-6), atol=0, rtol=0)


def test_context_gather_matches_vllm_gather_semantics(vllm):
    """gather_and_maybe_dequant_cache (the CUDA path, "auto" cache): workspace token i of request r is the cached
    latent at position starts[r] + (i - cu_seq_lens[r]) of that request's blocks; the rest is untouched."""
    block_size, width = 4, LATENT + ROPE
    cache = torch.randn(10, block_size, width)
    block_table = torch.tensor([[9, 9, 9], [3, 1, 7], [2, 5, 0]], dtype=torch.int32)
    chunk = types.SimpleNamespace(
        num_context_tokens=7, request_slice=slice(1, 3), starts=torch.tensor([2, 4]),
        cu_seq_lens=torch.tensor([0, 5, 7]), token_to_seq=torch.tensor([0, 0, 0, 0, 0, 1, 1]), num_requests=2,
    )
    workspace = torch.full((9, width), 7.0)
    prefill = types.SimpleNamespace(chunked_context=types.SimpleNamespace(workspace=workspace),
                                    block_table=block_table)
    mla.gather_context_latent(types.SimpleNamespace(kv_cache_dtype="auto"), chunk, cache, prefill, False)
    table = block_table[chunk.request_slice]
    for i in range(chunk.num_context_tokens):
        r = int(chunk.token_to_seq[i])
        pos = int(chunk.starts[r]) + i - int(chunk.cu_seq_lens[r])
        assert torch.equal(workspace[i], cache[int(table[r, pos // block_size]), pos % block_size])
    assert torch.equal(workspace[7:], torch.full((2, width), 7.0))


def test_context_chunk_attention_writes_out_like_vllm_cpu_sdpa(vllm):
    """vLLM's CPU SDPA context chunk (which refuses `out`) gives the values; ours also fills `out` and returns it."""
    from vllm.v1.attention.backends.mla.prefill.cpu_sdpa import CPUSDPAMLAPrefillBackend

    target = "vllm.v1.attention.backends.mla.prefill.cpu_sdpa:CPUSDPAMLAPrefillBackend.run_prefill_context_chunk"
    vllm_chunk = (patching.original(target) if patching.is_installed(target)
                  else CPUSDPAMLAPrefillBackend.run_prefill_context_chunk)
    backend = object.__new__(CPUSDPAMLAPrefillBackend)
    backend.scale = 0.3
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(5, 2, 8, generator=g), torch.randn(7, 2, 8, generator=g), torch.randn(7, 2, 4, generator=g)
    chunk = types.SimpleNamespace(query_start_loc=torch.tensor([0, 2, 5]), cu_seq_lens=torch.tensor([0, 4, 7]))
    want, want_lse = vllm_chunk(backend, chunk, q, k, v)
    out = torch.full((5, 2, 4), 7.0)
    got, lse = mla.run_prefill_context_chunk(backend, chunk, q, k, v, out=out)
    assert got is out and torch.equal(out, want) and torch.equal(lse, want_lse)
    got, lse = mla.run_prefill_context_chunk(backend, chunk, q, k, v)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
