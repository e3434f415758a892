"""KDA references: the recurrent form, the recurrent form with every state kept, the chunked form.

flash-linear-attention's conventions (`naive_recurrent_kda`): q, k, g [B, T, H, dk], v [B, T, H, dv],
beta [B, T, H] already in (0, 1), g a per-key-channel log decay, q and k L2-normalised by the caller,
states [B, H, dk, dv]. Math runs in fp32 (fp64 when an input is fp64); o comes back in v's dtype.
The math is written out in opts/kda_overlap/README.md.
"""

from __future__ import annotations

import itertools

import torch

from opts.k3.kda_checks import check_cu_seqlens, check_kda_inputs, check_state, compute_dtype


def recurrent_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  scale: float | None = None, initial_state: torch.Tensor | None = None,
                  output_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token KDA. Returns (o [B, T, H, dv], final state [B, H, dk, dv] or None)."""
    o, _, final = _recurrent(q, k, v, g, beta, scale, initial_state, keep_states=False)
    return o, (final if output_final_state else None)


def recurrent_kda_states(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, scale: float | None = None,
                         initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token KDA keeping the state after every position: (o, states [B, T, H, dk, dv])."""
    o, states, _ = _recurrent(q, k, v, g, beta, scale, initial_state, keep_states=True)
    return o, states


def _recurrent(q, k, v, g, beta, scale, initial_state, *, keep_states):
    dims = check_kda_inputs(q, k, v, g, beta)
    check_state("initial_state", initial_state, dims.batch, dims)
    ct = compute_dtype(q, k, v, g, beta, initial_state)
    out_dtype = v.dtype
    scale = dims.dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(ct) for x in (q, k, v, g, beta))
    b, t_len, h, dk, dv = dims.batch, dims.time, dims.heads, dims.dk, dims.dv
    state = (torch.zeros(b, h, dk, dv, dtype=ct, device=q.device) if initial_state is None
             else initial_state.to(ct).clone())
    o = torch.empty(b, t_len, h, dv, dtype=ct, device=q.device)
    states = torch.empty(b, t_len, h, dk, dv, dtype=ct, device=q.device) if keep_states else None
    for t in range(t_len):
        state = state * g[:, t].exp()[..., None]
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        correction = beta[:, t, :, None] * (v[:, t] - predicted)
        state = state + k[:, t, :, :, None] * correction[:, :, None, :]
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state)
        if states is not None:
            states[:, t] = state
    return o.to(out_dtype), states, state


def chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
              scale: float | None = None, initial_state: torch.Tensor | None = None,
              output_final_state: bool = False, chunk_size: int = 64,
              cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked KDA (WY/UT form), equal to `recurrent_kda` up to rounding; any length, last chunk may be short.

    With `cu_seqlens` ([N+1], flash-linear-attention's varlen convention) the batch must be 1 and holds N
    packed sequences; initial and final states are then [N, H, dk, dv].
    """
    dims = check_kda_inputs(q, k, v, g, beta)
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    if cu_seqlens is None:
        seqs = [(b, 0, dims.time) for b in range(dims.batch)]
    else:
        if dims.batch != 1:
            raise ValueError(f"q: with cu_seqlens the batch must be 1 (packed sequences), got {dims.batch}")
        bounds = check_cu_seqlens(cu_seqlens, dims.time)
        seqs = [(0, s, e) for s, e in itertools.pairwise(bounds)]
    check_state("initial_state", initial_state, len(seqs), dims)
    ct = compute_dtype(q, k, v, g, beta, initial_state)
    out_dtype = v.dtype
    scale = dims.dk ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(ct) for x in (q, k, v, g, beta))
    o = torch.empty(dims.batch, dims.time, dims.heads, dims.dv, dtype=ct, device=q.device)
    finals = torch.empty(len(seqs), dims.heads, dims.dk, dims.dv, dtype=ct, device=q.device)
    for n, (b, start, end) in enumerate(seqs):
        state = (torch.zeros(dims.heads, dims.dk, dims.dv, dtype=ct, device=q.device) if initial_state is None
                 else initial_state[n].to(ct))
        for c0 in range(start, end, chunk_size):
            c1 = min(c0 + chunk_size, end)
            sl = slice(c0, c1)
            o[b, sl], state = _chunk_step(q[b, sl], k[b, sl], v[b, sl], g[b, sl], beta[b, sl], state, scale)
        finals[n] = state
    return o.to(out_dtype), (finals if output_final_state else None)


def _chunk_step(q, k, v, g, beta, state, scale):
    """One chunk of one sequence. q, k, g [L, H, dk]; v [L, H, dv]; beta [L, H]; state [H, dk, dv]."""
    q, k, v, g = (x.transpose(0, 1) for x in (q, k, v, g))     # [H, L, D]
    beta = beta.transpose(0, 1)[..., None]                      # [H, L, 1]
    length = q.shape[1]
    gam = g.cumsum(1)                                           # log decay from the chunk start through t
    pos = torch.arange(length, device=q.device)
    causal = (pos[:, None] >= pos[None, :])[None, :, :, None]   # i <= t
    diff = gam[:, :, None, :] - gam[:, None, :, :]              # [H, L(t), L(i), dk]: γ_t − γ_i
    decay = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()
    a_kk = (torch.einsum("htd,hid,htid->hti", k, k, decay) * beta).tril(-1)
    a_qk = torch.einsum("htd,hid,htid->hti", q, k, decay) * scale
    eye = torch.eye(length, dtype=q.dtype, device=q.device)
    rhs = torch.cat([beta * v, beta * gam.exp() * k], dim=-1)
    u, w = torch.linalg.solve_triangular(eye + a_kk, rhs, upper=False).split([v.shape[-1], k.shape[-1]], -1)
    delta = u - w @ state                                       # the corrected values
    o = (scale * gam.exp() * q) @ state + a_qk @ delta
    new_state = gam[:, -1, :, None].exp() * state + (decay[:, -1] * k).transpose(1, 2) @ delta
    return o.transpose(0, 1), new_state
