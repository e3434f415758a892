"""The CPU path's KDA kernels (vLLM calling conventions) against each other and the project's references."""

from __future__ import annotations

import pytest
import torch

from ablations.backends.vllm.cpu import kda
from opts.kda_overlap import naive

H, K, V = 2, 8, 8
ATOL = 1e-5


def inputs(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
    v = torch.randn(1, T, H, V, generator=g)
    raw_g, raw_beta = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, generator=g)
    A_log, dt_bias = torch.rand(H, generator=g) * 2, torch.randn(H * K, generator=g) * 0.1
    return q, k, v, raw_g, raw_beta, A_log, dt_bias


@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_gate_matches_the_kernels_formula(lower_bound):
    _, _, _, raw_g, _, A_log, dt_bias = inputs(5)
    x = raw_g + dt_bias.view(H, K)
    a = A_log.exp().view(H, 1)
    expected = lower_bound * torch.sigmoid(a * x) if lower_bound is not None else -a * torch.log1p(x.exp())
    torch.testing.assert_close(kda.activate_gate(raw_g, A_log, dt_bias, lower_bound), expected, atol=1e-6, rtol=0)


def test_chunk_prefill_equals_token_by_token_decode():
    """Chunked prefill of two packed sequences == packed decode one token at a time, outputs and states."""
    T1, T2 = 11, 7
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(T1 + T2)
    h0 = torch.randn(2, H, V, K, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, T1, T1 + T2], dtype=torch.int32)
    o_chunk, final = kda.chunk_kda_with_fused_gate(
        q, k, v, raw_g, raw_beta, A_log, dt_bias, initial_state=h0.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )
    cache = torch.zeros(4, H, V, K)
    cache[1], cache[3] = h0[0], h0[1]
    o_dec = torch.empty_like(v)
    for t in range(T1 + T2):
        slot = 1 if t < T1 else 3
        packed = torch.cat([q[0, t].flatten(), k[0, t].flatten(), v[0, t].flatten()]).view(1, -1)
        o, _ = kda.fused_recurrent_kda_packed_decode(
            packed, raw_g[:, t : t + 1], raw_beta[:, t : t + 1], A_log, dt_bias, None, cache,
            torch.tensor([slot]),
        )
        o_dec[0, t] = o[0, 0]
    torch.testing.assert_close(o_chunk, o_dec, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(final, cache[[1, 3]], atol=ATOL, rtol=1e-4)


def test_verify_reads_the_accepted_slot_and_writes_every_position():
    """Speculative rows start from slot [n, num_accepted-1] and leave the state after token t in slot [n, t]."""
    T = 3
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(2 * T, seed=2)
    cache = torch.randn(10, H, V, K, generator=torch.Generator().manual_seed(3))
    start = cache.clone()
    slots = torch.tensor([[1, 2, 3], [4, 5, 6]])
    accepted = torch.tensor([2, 1])
    cu = torch.tensor([0, T, 2 * T], dtype=torch.int32)
    out, _ = kda.fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, None, cache, cu, slots, accepted)
    g = kda.activate_gate(raw_g, A_log, dt_bias, None)
    beta = torch.sigmoid(raw_beta)
    qn, kn = kda.l2_normalize(q), kda.l2_normalize(k)
    for n, src in ((0, 2), (1, 4)):
        rows = slice(n * T, (n + 1) * T)
        o_ref, states = naive.recurrent_kda_states(
            qn[:, rows], kn[:, rows], v[:, rows], g[:, rows], beta[:, rows],
            initial_state=start[src : src + 1].transpose(-1, -2),
        )
        torch.testing.assert_close(out[:, rows], o_ref, atol=ATOL, rtol=1e-4)
        for t in range(T):
            torch.testing.assert_close(cache[slots[n, t]], states[0, t].transpose(-1, -2), atol=ATOL, rtol=1e-4)


def test_null_slot_outputs_zero_and_writes_nothing():
    q, k, v, raw_g, raw_beta, A_log, dt_bias = inputs(2, seed=4)
    cache = torch.randn(3, H, V, K)
    before = cache.clone()
    packed = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], dim=-1)
    out, _ = kda.fused_recurrent_kda_packed_decode(packed, raw_g, raw_beta, A_log, dt_bias, None, cache,
                                                   torch.tensor([0, 2]))
    assert torch.equal(out[0, 0], torch.zeros(H, V))
    assert torch.equal(cache[:2], before[:2]) and not torch.equal(cache[2], before[2])


def test_gather_initial_states_zeroes_rows_without_state():
    state = torch.randn(5, H, V, K)
    got = kda.gather_initial_states(state, torch.tensor([3, 1]), torch.tensor([True, False]))
    assert torch.equal(got[0], state[3]) and torch.equal(got[1], torch.zeros(H, V, K))


def test_l2_normalize_uses_the_kernels_epsilon():
    x = torch.randn(4, K)
    torch.testing.assert_close(kda.l2_normalize(x), x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))
