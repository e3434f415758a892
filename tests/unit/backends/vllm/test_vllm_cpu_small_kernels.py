"""MTP input, AttnRes and the aligned KDA state slots against vLLM: its Triton kernels transcribed below, and its
PyTorch `mamba_get_block_table_tensor` (v1/attention/backends/utils.py:1163-1195)."""

from __future__ import annotations

import pytest
import torch

from ablations.backends.vllm.in_vllm.cpu import attn_res, kda_metadata, mtp


def kernel_rms_norm(x, weight, eps):
    """`_rms_norm` of models/kimi_k3/common/mtp.py:10-14 (fp32)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * weight.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mtp_input_matches_the_kernel(dtype):
    """_fused_mtp_input_kernel (models/kimi_k3/common/mtp.py:17-61): the embedding is masked to zero at position 0
    (a masked load: even a NaN there reads as 0), both halves RMS-normed, stored in the embedding dtype."""
    g = torch.Generator().manual_seed(0)
    T, hidden = 5, 24
    positions = torch.tensor([0, 1, 2, 0, 7])
    embeds = torch.randn(T, hidden + 8, generator=g).to(dtype)[:, :hidden]  # row-strided, as the kernel allows
    embeds[3, 0] = float("nan")
    hidden_states = torch.randn(T, hidden, generator=g).to(dtype)
    enorm, hnorm = torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5
    live = (positions != 0).view(-1, 1)
    want = torch.cat([kernel_rms_norm(torch.where(live, embeds.float(), 0.0), enorm, 1e-6),
                      kernel_rms_norm(hidden_states, hnorm, 1e-6)], dim=-1).to(dtype)
    got = mtp.fused_mtp_input(positions, embeds, hidden_states, enorm, hnorm, 1e-6)
    assert got.dtype == dtype and got.shape == (T, 2 * hidden)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert torch.equal(got[[0, 3], :hidden], torch.zeros(2, hidden, dtype=dtype))


def test_mtp_input_without_tokens():
    got = mtp.fused_mtp_input(torch.zeros(0, dtype=torch.long), torch.zeros(0, 8), torch.zeros(0, 8), torch.ones(8),
                              torch.ones(8), 1e-6)
    assert got.shape == (0, 16)


def kernel_attn_res(prefix, delta, blocks, norm_w, qk_w, out_w, num_blocks, write_idx, eps, out_eps):
    """_attn_res_kernel (models/kimi_k3/nvidia/ops/attn_res.py:34-167) on copies: (output, prefix, blocks)."""
    prefix, blocks = prefix.clone(), blocks.clone()
    current = prefix.float()
    if delta is not None:
        current = (current + delta.float()).to(prefix.dtype).float()  # rounded to the prefix dtype (:79-80)
        prefix.copy_(current)
    if write_idx >= 0:
        blocks[:, write_idx] = current.to(blocks.dtype)
    mixed = current
    if num_blocks > 0:
        sources = torch.cat([blocks[:, :num_blocks].float(), prefix.float().unsqueeze(1)], dim=1)
        rstd = torch.rsqrt((sources * sources).sum(-1) / sources.shape[-1] + eps)
        logits = (sources * (norm_w.float() * qk_w.float())).sum(-1) * rstd
        weights = torch.exp(logits - logits.max(-1, keepdim=True).values)
        mixed = (weights.unsqueeze(-1) * sources).sum(1) / weights.sum(-1, keepdim=True)
    out = mixed
    if out_w is not None:
        out = mixed * torch.rsqrt((mixed * mixed).sum(-1, keepdim=True) / mixed.shape[-1] + out_eps) * out_w.float()
    return out.to(prefix.dtype), prefix, blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_blocks", "write_idx", "with_delta", "with_out_norm"), [
    (0, 0, False, True), (1, -1, True, True), (2, 1, True, False), (3, 3, True, True), (3, -1, False, True),
])
def test_attn_res_matches_the_kernel(dtype, num_blocks, write_idx, with_delta, with_out_norm):
    g = torch.Generator().manual_seed(num_blocks * 7 + write_idx)
    T, hidden, max_blocks = 4, 32, 4
    prefix = torch.randn(T, hidden, generator=g).to(dtype)
    blocks = torch.randn(T, max_blocks, hidden, generator=g).to(dtype)
    delta = torch.randn(T, hidden, generator=g).to(dtype) if with_delta else None
    norm_w, qk_w = torch.rand(hidden, generator=g) + 0.5, torch.randn(hidden, generator=g)
    out_w = torch.rand(hidden, generator=g) + 0.5 if with_out_norm else None
    want, want_prefix, want_blocks = kernel_attn_res(prefix, delta, blocks, norm_w, qk_w, out_w, num_blocks,
                                                     write_idx, 1e-6, 1e-5)
    got = attn_res.attn_res(prefix, delta, blocks, norm_w, qk_w, out_w, num_blocks, write_idx, 1e-6, 1e-5)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, **tol)
    assert torch.equal(prefix, want_prefix) and torch.equal(blocks, want_blocks)


def mamba_spec(num_speculative_blocks: int, block_size: int = 4):
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(block_size=block_size, shapes=((2, 3),), dtypes=(torch.float32,),
                     mamba_cache_mode="align", num_speculative_blocks=num_speculative_blocks)


@pytest.mark.parametrize("num_speculative_blocks", [0, 2])
def test_aligned_state_slots_match_vllm_torch_reference(vllm, num_speculative_blocks):
    """The block holding token seq_len-1, then the speculative blocks after it (seq_len 0 -> column 0)."""
    from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor

    table = torch.arange(1, 1 + 5 * 8, dtype=torch.int32).view(5, 8)
    seq_lens = torch.tensor([0, 1, 4, 5, 17], dtype=torch.int32)
    spec = mamba_spec(num_speculative_blocks)
    want = mamba_get_block_table_tensor(table, seq_lens, spec, "align")
    got = kda_metadata.mamba_get_block_table_tensor(table, seq_lens, spec, "align")
    assert got.dtype == table.dtype and torch.equal(got, want)
    assert kda_metadata.mamba_get_block_table_tensor(table, seq_lens, spec, "none") is table


def test_aligned_state_slots_past_the_table_are_null(vllm):
    """Where vLLM's kernel would read past the row (torch.gather raises), the slot is the null block 0."""
    table = torch.arange(1, 1 + 2 * 4, dtype=torch.int32).view(2, 4)
    got = kda_metadata.mamba_get_block_table_tensor(table, torch.tensor([16, 9]), mamba_spec(2), "align")
    assert got.tolist() == [[4, 0, 0], [7, 8, 0]]
