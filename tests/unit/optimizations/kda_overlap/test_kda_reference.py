"""The KDA references: recurrent against a hand-worked step, chunked and per-position states against recurrent."""

import math

import pytest
import torch

from opts.kda_overlap.inputs import random_kda_tensors, random_state
from opts.kda_overlap.reference import chunk_kda, recurrent_kda, recurrent_kda_states

F64 = torch.float64


def inputs(b, t, h, dk, dv, *, dtype=F64, seed=0, decay=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = random_kda_tensors((b, t), h, dk, dv, dtype=dtype, generator=gen, decay=decay)
    return x, random_state(b, h, dk, dv, generator=gen, dtype=torch.float32)


def test_recurrent_matches_a_hand_worked_step():
    # One head, dk = dv = 2, one token. S0 = [[1, 2], [3, 4]], g = log([0.5, 1]), k = [1, 0], q = [0, 1],
    # v = [10, 20], beta = 0.5, scale = 1.
    # decayed S = [[0.5, 1], [3, 4]]; S^T k = [0.5, 1]; correction = 0.5 * ([10, 20] - [0.5, 1]) = [4.75, 9.5]
    # S1 = [[0.5 + 4.75, 1 + 9.5], [3, 4]] = [[5.25, 10.5], [3, 4]]; o = S1^T q = [3, 4].
    s0 = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], dtype=F64)
    g = torch.log(torch.tensor([0.5, 1.0], dtype=F64)).view(1, 1, 1, 2)
    k = torch.tensor([1.0, 0.0], dtype=F64).view(1, 1, 1, 2)
    q = torch.tensor([0.0, 1.0], dtype=F64).view(1, 1, 1, 2)
    v = torch.tensor([10.0, 20.0], dtype=F64).view(1, 1, 1, 2)
    beta = torch.tensor([0.5], dtype=F64).view(1, 1, 1)
    o, s1 = recurrent_kda(q, k, v, g, beta, scale=1.0, initial_state=s0, output_final_state=True)
    torch.testing.assert_close(s1, torch.tensor([[[[5.25, 10.5], [3.0, 4.0]]]], dtype=F64))
    torch.testing.assert_close(o, torch.tensor([[[[3.0, 4.0]]]], dtype=F64))
    o_default, _ = recurrent_kda(q, k, v, g, beta, initial_state=s0)
    torch.testing.assert_close(o_default, o / math.sqrt(2))


def test_recurrent_states_are_the_states_of_every_prefix():
    (q, k, v, g, beta), s0 = inputs(2, 7, 3, 8, 4)
    o, states = recurrent_kda_states(q, k, v, g, beta, initial_state=s0)
    assert states.shape == (2, 7, 3, 8, 4) and states.dtype == F64
    for t in (0, 3, 6):
        sl = slice(0, t + 1)
        o_t, s_t = recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=s0,
                                 output_final_state=True)
        torch.testing.assert_close(states[:, t], s_t, rtol=0, atol=0)
        torch.testing.assert_close(o[:, sl], o_t, rtol=0, atol=0)


@pytest.mark.parametrize("t_len,chunk", [(1, 64), (37, 16), (64, 64), (130, 64), (45, 8)])
@pytest.mark.parametrize("with_state", [True, False])
def test_chunk_equals_recurrent_float64(t_len, chunk, with_state):
    (q, k, v, g, beta), s0 = inputs(2, t_len, 3, 16, 8, seed=t_len)
    s0 = s0.to(F64) if with_state else None
    o_r, s_r = recurrent_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True)
    o_c, s_c = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=chunk)
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)


def test_chunk_holds_under_fast_decay():
    # log decay down to about -40 per token: exp(cumsum) over a chunk underflows; the pairwise form must not.
    (q, k, v, g, beta), s0 = inputs(1, 50, 2, 8, 4, decay=12.0)
    o_r, s_r = recurrent_kda(q, k, v, g, beta, initial_state=s0.to(F64), output_final_state=True)
    o_c, s_c = chunk_kda(q, k, v, g, beta, initial_state=s0.to(F64), output_final_state=True, chunk_size=32)
    assert torch.isfinite(o_c).all()
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 1.6e-2)])
def test_low_precision_against_float64(dtype, tol):
    (q, k, v, g, beta), s0 = inputs(1, 70, 3, 32, 16, dtype=dtype, seed=3)
    ref_o, ref_s = recurrent_kda(*(x.to(F64) for x in (q, k, v, g, beta)), initial_state=s0.to(F64),
                                 output_final_state=True)
    for fn in (recurrent_kda, chunk_kda):
        o, s = fn(q, k, v, g, beta, initial_state=s0, output_final_state=True)
        assert o.dtype == dtype and s.dtype == torch.float32
        torch.testing.assert_close(o.to(F64), ref_o, rtol=tol, atol=tol)
        torch.testing.assert_close(s.to(F64), ref_s, rtol=2e-5, atol=2e-5)


def test_chunk_varlen_equals_each_sequence_alone():
    lens = [5, 0, 70, 1]
    cu = torch.tensor([0, 5, 5, 75, 76])
    (q, k, v, g, beta), _ = inputs(1, sum(lens), 3, 8, 8, seed=5)
    gen = torch.Generator().manual_seed(9)
    s0 = random_state(len(lens), 3, 8, 8, generator=gen, dtype=F64)
    o, finals = chunk_kda(q, k, v, g, beta, initial_state=s0, output_final_state=True, chunk_size=16,
                          cu_seqlens=cu)
    for n, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if s == e:
            torch.testing.assert_close(finals[n], s0[n], rtol=0, atol=0)
            continue
        sl = slice(s, e)
        o_n, s_n = recurrent_kda(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], initial_state=s0[n:n + 1],
                                 output_final_state=True)
        torch.testing.assert_close(o[:, sl], o_n, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(finals[n], s_n[0], rtol=1e-10, atol=1e-10)


def test_bad_inputs_name_the_argument():
    (q, k, v, g, beta), s0 = inputs(2, 4, 2, 8, 4)
    with pytest.raises(ValueError, match="beta: expected shape"):
        recurrent_kda(q, k, v, g, beta[..., :1])
    with pytest.raises(ValueError, match="initial_state: expected shape"):
        recurrent_kda(q, k, v, g, beta, initial_state=s0[:1])
    with pytest.raises(ValueError, match="batch must be 1"):
        chunk_kda(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="cu_seqlens: must start at 0"):
        chunk_kda(q[:1], k[:1], v[:1], g[:1], beta[:1], cu_seqlens=torch.tensor([0, 3, 2, 4]))
