"""Batched recurrent KDA over verification rows: what vLLM runs for speculative verification today.

All rows of one length advance together, one position at a time (vLLM's fused_recurrent_kda is one launch
over all rows; here each position is a handful of batched ops), and the state after every position is
written out for rollback.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# rows advanced together through all their positions, so their states stay in cache between positions
SLAB_BYTES = 4 << 20


def recurrent_kda_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       row_lens: Sequence[int], initial_state: torch.Tensor, *, scale: float,
                       o_out: torch.Tensor, states_out: torch.Tensor) -> None:
    """Rows packed along dim 0: q, k, g [T_v, H, dk], v [T_v, H, dv], beta [T_v, H]; row r continues
    `initial_state[r]` ([R, H, dk, dv]). Writes o into `o_out` [T_v, H, dv] and the state after every
    position into `states_out` [T_v, H, dk, dv]. A row of length 0 writes nothing."""
    if len(row_lens) != initial_state.shape[0]:
        raise ValueError(f"initial_state: expected {len(row_lens)} rows (one per row), got "
                         f"{initial_state.shape[0]}")
    ct = torch.float64 if torch.float64 in (q.dtype, initial_state.dtype) else torch.float32
    starts = [0]
    for length in row_lens:
        starts.append(starts[-1] + length)
    groups: dict[int, list[int]] = {}
    for r, length in enumerate(row_lens):
        if length:
            groups.setdefault(length, []).append(r)
    for length, rows in sorted(groups.items()):
        _advance(q, k, v, g, beta, length, rows, starts, initial_state, scale, ct, o_out, states_out)


def _advance(q, k, v, g, beta, length, rows, starts, initial_state, scale, ct, o_out, states_out):
    n = len(rows)
    h, dk, dv = q.shape[1], q.shape[2], v.shape[2]
    tokens = torch.tensor([starts[r] for r in rows], dtype=torch.long, device=q.device)[:, None] \
        + torch.arange(length, device=q.device)
    qs, ks, vs, gs, bs = (x[tokens].to(ct) for x in (q, k, v, g, beta))        # [n, L, H, ...]
    decays = gs.exp()
    probes = torch.stack([ks * decays, qs * decays], dim=-2)                     # [n, L, H, 2, dk]
    qk = (qs * ks).sum(-1, keepdim=True)
    o = torch.empty(n, length, h, dv, dtype=ct, device=q.device)
    consecutive = rows == list(range(rows[0], rows[0] + n))
    first = starts[rows[0]]
    slots = states_out[first:first + n * length].view(n, length, h, dk, dv) if consecutive else None
    per_slab = max(1, SLAB_BYTES // (h * dk * dv * torch.finfo(ct).bits // 8))
    for a in range(0, n, per_slab):
        b = min(a + per_slab, n)
        state = initial_state[rows[a]:rows[a] + b - a] if consecutive else initial_state[rows[a:b]]
        work = torch.empty(b - a, h, dk, dv, dtype=ct, device=q.device)
        for t in range(length):
            y = torch.matmul(probes[a:b, t], state if state.dtype == ct else state.to(ct))  # (D S)ᵀ k, (D S)ᵀ q
            delta = (vs[a:b, t] - y[:, :, 0]).mul_(bs[a:b, t, :, None])
            torch.add(y[:, :, 1], delta * qk[a:b, t], out=o[a:b, t]).mul_(scale)
            torch.mul(state, decays[a:b, t, :, :, None], out=work)
            work.addcmul_(ks[a:b, t, :, :, None], delta[:, :, None, :])
            if slots is not None:
                slots[a:b, t].copy_(work)
            else:
                states_out[tokens[a:b, t]] = work
            state = work
    o_out[tokens] = o.to(o_out.dtype)
