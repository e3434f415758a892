"""The CPU short-conv update against vLLM: its PyTorch references (`causal_conv1d_update_torch`,
`causal_conv1d_fn_cpu`, model_executor/layers/mamba/ops/cpu/causal_conv1d.py) and, for the speculative
window, its Triton kernel (ops/causal_conv1d.py:763-1093) transcribed below."""

from __future__ import annotations

import torch

from ablations.backends.vllm.in_vllm.cpu.conv import causal_conv1d_update

DIM, WIDTH = 6, 4


def setup(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, DIM, generator=g), torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)


def kernel_spec_update(x, state, weight, bias, slots, accepted, cu):
    """_causal_conv1d_update_kernel with num_accepted_tokens (varlen): window at num_accepted-1, then the slot
    holds [window[1:], the step's tokens] from position 0; a null slot (0) skips the row."""
    out = x.clone()
    for n in range(len(cu) - 1):
        slot, offset, seq = int(slots[n]), int(accepted[n]) - 1, x[cu[n] : cu[n + 1]].t()
        if slot == 0 or seq.shape[1] == 0:
            continue
        hist = state[slot, :, offset : offset + WIDTH - 1].clone()
        window = torch.cat([hist, seq], dim=-1)
        for t in range(seq.shape[1]):
            acc = bias + (window[:, t : t + WIDTH] * weight).sum(-1)
            out[cu[n] + t] = acc / (1 + torch.exp(-acc))
        new = torch.cat([hist[:, 1:], seq], dim=-1)
        state[slot, :, : new.shape[1]] = new
    return out


def test_decode_matches_vllm_torch_update(vllm):
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_update_torch

    x, w, b = setup(3)
    state = torch.randn(5, DIM, WIDTH - 1)
    slots = torch.tensor([4, 0, 2], dtype=torch.int32)
    want_state = state.clone()
    dense = want_state[[4, 2]]
    want = causal_conv1d_update_torch(x[[0, 2]].unsqueeze(-1), dense, w, b, activation="silu")[..., 0]
    want_state[[4, 2]] = dense
    out = torch.full_like(x, 7.0)
    got = causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=slots, out=out)
    assert got is out
    torch.testing.assert_close(got[[0, 2]], want, atol=1e-6, rtol=1e-6)
    assert torch.equal(got[1], torch.full((DIM,), 7.0))  # null block: output untouched
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


def test_varlen_rows_without_speculation_match_vllm_torch_update(vllm):
    """query_start_loc without num_accepted: two 2-token rows, as the dense [batch, dim, 2] update."""
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_update_torch

    x, w, b = setup(4, seed=4)
    state = torch.randn(3, DIM, WIDTH - 1)
    want_state = state.clone()
    dense = want_state[[2, 1]]
    want = causal_conv1d_update_torch(x.view(2, 2, DIM).transpose(1, 2), dense, w, b, activation="silu")
    want_state[[2, 1]] = dense
    got = causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=torch.tensor([2, 1]),
                               query_start_loc=torch.tensor([0, 2, 4]), max_query_len=2)
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(4, DIM), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


def test_decode_without_out_overwrites_x():
    """`out=None`: the result lands in x (vLLM: out = x), null rows keep their input."""
    x, w, b = setup(2, seed=1)
    x0 = x.clone()
    got = causal_conv1d_update(x, torch.zeros(2, DIM, WIDTH - 1), w, b, activation="silu",
                               conv_state_indices=torch.tensor([1, 0]))
    assert got.data_ptr() == x.data_ptr() and torch.equal(x[1], x0[1]) and not torch.equal(x[0], x0[0])


def test_decode_one_token_at_a_time_matches_vllm_prefill_conv(vllm):
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    x, w, b = setup(9)
    want = causal_conv1d_fn_cpu(x.t().contiguous(), w, b, torch.zeros(1, DIM, WIDTH - 1),
                                torch.tensor([0, 9]), activation="silu").t()
    state = torch.zeros(3, DIM, WIDTH - 1)
    got = torch.stack([
        causal_conv1d_update(x[t : t + 1], state, w, b, activation="silu", conv_state_indices=torch.tensor([2]))[0]
        for t in range(9)
    ])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(state[:2], torch.zeros(2, DIM, WIDTH - 1))


def test_speculative_step_matches_the_kernel():
    """Varlen rows of different lengths and accepted counts, a null row, an empty row."""
    num_spec = 2
    x, w, b = setup(7, seed=2)
    state = torch.randn(6, DIM, WIDTH - 1 + num_spec)
    slots = torch.tensor([3, 0, 5, 1], dtype=torch.int32)
    accepted = torch.tensor([2, 1, 3, 1], dtype=torch.int32)
    cu = torch.tensor([0, 3, 5, 7, 7], dtype=torch.int32)
    want_state = state.clone()
    want = kernel_spec_update(x, want_state, w, b, slots, accepted, cu.tolist())
    got = causal_conv1d_update(x.clone(), state, w, b, activation="silu", conv_state_indices=slots,
                               num_accepted_tokens=accepted, query_start_loc=cu, max_query_len=3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, want_state, atol=0, rtol=0)


def test_speculative_rows_with_zero_accepted_tokens_are_skipped():
    """vLLM pads with num_accepted = 1; 0 would read before the window. Here the row is left alone."""
    x, w, b = setup(3, seed=3)
    state = torch.randn(2, DIM, WIDTH - 1 + 2)
    before, out = state.clone(), torch.full_like(x, 7.0)
    causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=torch.tensor([1]),
                         num_accepted_tokens=torch.tensor([0]), query_start_loc=torch.tensor([0, 3]),
                         max_query_len=3, out=out)
    assert torch.equal(state, before) and torch.equal(out, torch.full_like(x, 7.0))


def test_speculative_steps_reproduce_the_full_sequence_conv(vllm):
    """Verify steps of K+1 rows, a random number accepted, the rest wrong drafts: the accepted rows equal vLLM's
    prefill conv of the accepted sequence (the window slides by num_accepted - 1)."""
    from vllm.model_executor.layers.mamba.ops.cpu.causal_conv1d import causal_conv1d_fn_cpu

    num_spec = 2
    n = num_spec + 1
    x, w, b = setup(60, seed=1)
    reference = causal_conv1d_fn_cpu(x.t().contiguous(), w, b, torch.zeros(1, DIM, WIDTH - 1),
                                     torch.tensor([0, 60]), activation="silu").t()
    state = torch.zeros(2, DIM, WIDTH - 1 + num_spec)
    rng = torch.Generator().manual_seed(2)
    accepted_before, pos, steps = 1, 0, 0
    while pos + n <= 60:
        accepted = int(torch.randint(1, n + 1, (1,), generator=rng))
        rows = x[pos : pos + n].clone()
        rows[accepted:] = torch.randn(n - accepted, DIM, generator=rng)
        out = causal_conv1d_update(
            rows, state, w, b, activation="silu", conv_state_indices=torch.tensor([1]),
            num_accepted_tokens=torch.tensor([accepted_before]), query_start_loc=torch.tensor([0, n]),
            max_query_len=n,
        )
        torch.testing.assert_close(out[:accepted], reference[pos : pos + accepted], atol=1e-5, rtol=1e-5)
        accepted_before, pos, steps = accepted, pos + accepted, steps + 1
    assert steps > 10
