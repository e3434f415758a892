"""The CPU short-conv update (decode and speculative verification) against a full-sequence causal conv."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ablations.backends.vllm.cpu.conv import causal_conv1d_update

DIM, WIDTH = 6, 4


def full_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Reference: silu(causal depthwise conv) over a whole sequence x [T, dim], zero history."""
    padded = F.pad(x.t().unsqueeze(0), (WIDTH - 1, 0))
    return F.silu(F.conv1d(padded, weight.unsqueeze(1), bias, groups=DIM))[0].t()


def setup(T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, DIM, generator=g), torch.randn(DIM, WIDTH, generator=g), torch.randn(DIM, generator=g)


def test_decode_one_token_at_a_time_matches_full_conv():
    x, w, b = setup(9)
    state = torch.zeros(3, DIM, WIDTH - 1)
    out = torch.stack([
        causal_conv1d_update(x[t : t + 1], state, w, b, activation="silu", conv_state_indices=torch.tensor([2]))[0]
        for t in range(9)
    ])
    torch.testing.assert_close(out, full_conv(x, w, b), atol=1e-5, rtol=1e-5)
    assert torch.equal(state[:2], torch.zeros(2, DIM, WIDTH - 1))


def test_null_block_rows_are_skipped():
    x, w, b = setup(2)
    state = torch.randn(2, DIM, WIDTH - 1)
    before = state.clone()
    causal_conv1d_update(x, state, w, b, activation="silu", conv_state_indices=torch.tensor([0, 1]))
    assert torch.equal(state[0], before[0]) and not torch.equal(state[1], before[1])


def test_speculative_rows_use_the_accepted_window():
    """Verify steps of K+1 rows, of which a random number are accepted and the rest are wrong drafts,
    reproduce the full-sequence conv on the accepted rows (the window slides by num_accepted - 1)."""
    num_spec = 2
    n = num_spec + 1
    x, w, b = setup(60, seed=1)
    reference = full_conv(x, w, b)
    state = torch.zeros(2, DIM, WIDTH - 1 + num_spec)
    rng = torch.Generator().manual_seed(2)
    accepted_before, pos, steps = 1, 0, 0
    while pos + n <= 60:
        accepted = int(torch.randint(1, n + 1, (1,), generator=rng))
        rows = x[pos : pos + n].clone()
        rows[accepted:] = torch.randn(n - accepted, DIM, generator=rng)  # rejected drafts
        out = causal_conv1d_update(
            rows, state, w, b, activation="silu", conv_state_indices=torch.tensor([1]),
            num_accepted_tokens=torch.tensor([accepted_before]), query_start_loc=torch.tensor([0, n]),
            max_query_len=n,
        )
        torch.testing.assert_close(out[:accepted], reference[pos : pos + accepted], atol=1e-5, rtol=1e-5)
        accepted_before, pos, steps = accepted, pos + accepted, steps + 1
    assert steps > 10
