"""The CPU KDA kernels against vLLM's Triton kernels, transcribed here as plain PyTorch loops.

Sources (site-packages/vllm/models/kimi_k3/nvidia/ops/third_party/kda/): the gate and β
(fused_recurrent.py:56-90, chunk.py:734-780), the recurrent kernel (fused_recurrent.py:140-302: state
[dv, dk], initial slot `state_indices[n, num_accepted[n]-1]`, null slot <= 0, the state after token t
written to slot `state_indices[n, t]` when > 0), the packed decode kernel (:486-579), the chunked
prefill wrapper (chunk.py:681-731: dense initial/final states [N, H, dv, dk], zero state when None) and
gather_initial_states (model_executor/layers/mamba/ops/gather_initial_states.py:10-42).
"""

from __future__ import annotations

import pytest
import torch

from ablations.backends.vllm.in_vllm.cpu import kda

H, K, V = 2, 8, 8
TOL = {"atol": 2e-5, "rtol": 1e-4}


def inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
    v = torch.randn(1, T, H, V, generator=g)
    raw_g, raw_beta = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, generator=g)
    A_log, dt_bias = torch.rand(H, generator=g) * 2, torch.randn(H * K, generator=g) * 0.1
    return q, k, v, raw_g, raw_beta, A_log, dt_bias


def kernel_gate(raw_g, A_log, dt_bias, lower_bound):
    """fused_recurrent.py:243-260: x = raw + dt_bias; lower_bound·σ(e^A x), else −e^A·softplus(x) (threshold 20)."""
    x = raw_g.float() + (0 if dt_bias is None else dt_bias.float().view(H, K))
    a = A_log.float().exp().view(H, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(a * x)
    return -a * torch.where(x > 20, x, torch.log(1 + torch.exp(x)))


def l2(x):
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def kernel_step(h, q, k, v, g, beta, l2norm: bool = True):
    """One token of fused_recurrent_kda_fwd_kernel (:232-269) for all heads; h [H, V, K] fp32; q and k
    L2-normalised only under USE_QK_L2NORM_IN_KERNEL (`l2norm`)."""
    q, k = (l2(q), l2(k)) if l2norm else (q.float(), k.float())
    q = q * K**-0.5
    h = h * torch.exp(g)[:, None, :]
    v = (v.float() - (h * k[:, None, :]).sum(-1)) * beta[:, None]
    h = h + v[:, :, None] * k[:, None, :]
    return h, (h * q[:, None, :]).sum(-1)


def reference_recurrent(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, state, cu, slots, accepted, out,
                        l2norm: bool = True):
    """fused_recurrent_kda_fwd_kernel over every sequence, in place on `state` and `out` (vLLM's semantics)."""
    g, beta = kernel_gate(raw_g, A_log, dt_bias, lower_bound), torch.sigmoid(raw_beta.float())
    slots = slots.view(-1, 1) if slots.ndim == 1 else slots
    for n in range(cu.numel() - 1):
        bos, eos = int(cu[n]), int(cu[n + 1])
        if eos == bos:
            continue
        src = int(slots[n, 0 if accepted is None else int(accepted[n]) - 1])
        if src <= 0:
            out[0, bos] = 0
            continue
        h = state[src].float()
        for t in range(eos - bos):
            h, out[0, bos + t] = kernel_step(h, q[0, bos + t], k[0, bos + t], v[0, bos + t], g[0, bos + t],
                                             beta[0, bos + t], l2norm)
            if int(slots[n, t]) > 0:
                state[int(slots[n, t])] = h
    return out, state


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_gate_matches_the_kernels_formula(lower_bound):
    _, _, _, raw_g, _, A_log, dt_bias = inputs(5)
    raw_g = raw_g * 15  # past the softplus threshold too
    torch.testing.assert_close(kda.activate_gate(raw_g, A_log, dt_bias, lower_bound),
                               kernel_gate(raw_g, A_log, dt_bias, lower_bound), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("lower_bound", [None, -3.0])
@pytest.mark.parametrize("with_initial_state", [True, False])
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "no_l2norm"])
def test_chunk_prefill_matches_the_kernels_recurrence(lower_bound, with_initial_state, l2norm):
    """Packed sequences longer than one chunk: outputs and final states [N, H, dv, dk]; q and k normalised in the
    kernel only when asked (without it they are scaled to norm ~0.8, where the delta rule stays stable)."""
    lens = [70, 1, 9]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(sum(lens), seed=1)
    if not l2norm:
        q, k = q * 0.3, k * 0.3
    h0 = torch.randn(len(lens), H, V, K, generator=torch.Generator().manual_seed(2))
    out = torch.full_like(v, float("nan"))
    got, final = kda.chunk_kda_with_fused_gate(
        q, k, v, raw_g, raw_beta, A_log, dt_bias, initial_state=h0.clone() if with_initial_state else None,
        output_final_state=True, lower_bound=lower_bound, use_qk_l2norm_in_kernel=l2norm, cu_seqlens=cu, out=out,
    )
    state = torch.cat([torch.zeros(1, H, V, K), h0 if with_initial_state else torch.zeros_like(h0)])
    slots = torch.arange(1, len(lens) + 1).view(-1, 1).expand(-1, max(lens)).contiguous()
    want, want_state = reference_recurrent(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, state, cu, slots,
                                           None, torch.empty_like(v), l2norm)
    assert got is out
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(final, want_state[1:], **TOL)


def test_chunk_prefill_without_final_state_returns_none():
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(4)
    _, final = kda.chunk_kda_with_fused_gate(q, k, v, raw_g, raw_beta, A_log, dt_bias, use_qk_l2norm_in_kernel=True)
    assert final is None


def spec_case(seed: int = 3):
    """Four speculative rows of 3 tokens: live (accepted 2), live (accepted 1, last slot null), null start slot,
    and an empty row."""
    cu = torch.tensor([0, 3, 6, 9, 9], dtype=torch.int32)
    slots = torch.tensor([[1, 2, 3], [4, 5, 0], [0, 7, 8], [9, 10, 11]], dtype=torch.int32)
    accepted = torch.tensor([2, 1, 1, 3], dtype=torch.int32)
    return (*inputs(9, seed), cu, slots, accepted)


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_verify_matches_the_kernel_per_token_states_and_null_rows(lower_bound):
    q, k, v, raw_g, raw_beta, A_log, dt_bias, cu, slots, accepted = spec_case()
    cache = torch.randn(12, H, V, K, generator=torch.Generator().manual_seed(4))
    want_cache, got_cache = cache.clone(), cache.clone()
    want, _ = reference_recurrent(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, want_cache, cu, slots,
                                  accepted, torch.full_like(v, 7.0))
    got, _ = kda.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, got_cache, cu, slots,
                                     accepted, out=torch.full_like(v, 7.0))
    torch.testing.assert_close(got[:, :7], want[:, :7], **TOL)  # token 7, 8: the null row past its first token
    torch.testing.assert_close(got_cache, want_cache, **TOL)
    assert torch.equal(got_cache[[0, 6, 7, 8, 9, 10, 11]], cache[[0, 6, 7, 8, 9, 10, 11]])


def test_a_null_row_outputs_zero_on_every_token():
    """vLLM zeroes the null row's first token and leaves the others as they were; here all are zero."""
    q, k, v, raw_g, raw_beta, A_log, dt_bias, cu, slots, accepted = spec_case()
    out = torch.full_like(v, 7.0)
    kda.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, None, torch.randn(12, H, V, K), cu, slots,
                            accepted, out=out)
    assert torch.equal(out[:, 6:9], torch.zeros(1, 3, H, V))


def test_zero_accepted_tokens_make_the_row_null():
    """num_accepted 0 would make vLLM's kernel read the slot before the row; vLLM pads with 1. Here: null row."""
    q, k, v, raw_g, raw_beta, A_log, dt_bias, cu, slots, accepted = spec_case()
    accepted[0] = 0
    cache = torch.randn(12, H, V, K)
    before = cache.clone()
    out = torch.full_like(v, 7.0)
    kda.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, None, cache, cu, slots, accepted, out=out)
    assert torch.equal(out[:, :3], torch.zeros(1, 3, H, V))
    assert torch.equal(cache[[1, 2, 3]], before[[1, 2, 3]])


def test_verify_with_one_slot_per_token_row():
    """1-D state indices (T == N, no num_accepted): each row is one token reading and writing its own slot."""
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(3, seed=5)
    cu, slots = torch.arange(4, dtype=torch.int32), torch.tensor([2, 0, 1], dtype=torch.int32)
    cache = torch.randn(3, H, V, K)
    want_cache, got_cache = cache.clone(), cache.clone()
    want, _ = reference_recurrent(q, k, v, raw_g, raw_beta, A_log, dt_bias, None, want_cache, cu, slots, None,
                                  torch.empty_like(v))
    got, _ = kda.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, None, got_cache, cu, slots)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_cache, want_cache, **TOL)


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_packed_decode_matches_the_kernel(lower_bound):
    """fused_recurrent_kda_packed_decode_kernel: one token per row from a row-strided [q|k|v|gate] buffer."""
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(4, seed=6)
    slots = torch.tensor([3, 0, 1, -1], dtype=torch.int32)
    rows = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1), torch.randn(4, 5)], dim=-1)
    packed = rows[:, : 2 * H * K + H * V]
    cache = torch.randn(4, H, V, K, generator=torch.Generator().manual_seed(7))
    want_cache, got_cache = cache.clone(), cache.clone()
    g, beta = kernel_gate(raw_g, A_log, dt_bias, lower_bound), torch.sigmoid(raw_beta)
    want = torch.full((1, 4, H, V), 7.0)
    for n, slot in enumerate(slots.tolist()):
        if slot <= 0:
            want[0, n] = 0
            continue
        want_cache[slot], want[0, n] = kernel_step(want_cache[slot], q[0, n], k[0, n], v[0, n], g[0, n], beta[0, n])
    got, _ = kda.fused_recurrent_kda_packed_decode(packed, raw_g, raw_beta, A_log, dt_bias, lower_bound, got_cache,
                                                   slots, out=torch.full((1, 4, H, V), 7.0))
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got_cache, want_cache, **TOL)
    assert torch.equal(got_cache[[0, 2]], cache[[0, 2]])


def test_gather_initial_states_matches_the_kernel():
    """Rows without a state are zero and their index is never read (the kernel reads slot 0 for them)."""
    state = torch.randn(5, H, V, K)
    indices = torch.tensor([3, 99, 1, -1])
    has = torch.tensor([True, False, True, False])
    got = kda.gather_initial_states(state, indices, has)
    assert torch.equal(got, torch.stack([state[3], torch.zeros(H, V, K), state[1], torch.zeros(H, V, K)]))
    got[0] += 1
    assert torch.equal(state[3] + 1, got[0])  # a copy, not a view
