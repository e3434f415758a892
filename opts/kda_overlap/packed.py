"""Packed variable-length chunked KDA: many sequences in one pass, per-position states for the rows that ask.

Tokens are packed along dim 0 ([T, H, D]). Every sequence is cut into full chunks of `chunk_size` tokens and
at most one shorter tail. All chunks' intra-chunk work (scores, the UT solve) is batched; the state passes
along full chunks step by step, all sequences that still have a chunk at that step together; the tails
(short prefill ends and verification rows) then run batched by length. A sequence marked `keep_states`
(a verification row, <= chunk_size tokens) is one tail whose state after every position is written out. A
sequence with a snapshot offset (a multiple of chunk_size, at most its full chunks) has its state after that
many tokens written out too: ROCm's prefill checkpoints. The math is in README.md.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SUBCHUNK = 16
# exp() of a larger argument overflows fp32 soon after; inside a subchunk of 16 tokens the factored
# scores need exp(decay span), so a larger span takes the pairwise path (any gate >= -5 stays below).
MAX_SPAN = 80.0
# intra-chunk temporaries are built this many scalars at a time, to stay in cache and bound memory
SLAB_SCALARS = 1 << 20
# verification rows are finished a few at a time, so each slab's states are still in cache when next used
SLAB_STATE_BYTES = 2 << 20


@dataclass(frozen=True)
class TailGroup:
    """Tails of one length: the sequences, their token indices [n, length], whether to keep states."""

    length: int
    seq_ids: tuple[int, ...]
    tokens: torch.Tensor
    keep_states: bool


@dataclass(frozen=True)
class PackPlan:
    """Where every chunk of a packed batch lives; built once per step from the lengths (host-side ints)."""

    seq_lens: tuple[int, ...]
    chunk_size: int
    full_seqs: tuple[int, ...]
    steps: tuple[tuple[int, int], ...]
    full_tokens: torch.Tensor
    tails: tuple[TailGroup, ...]
    state_offsets: tuple[int, ...]
    snapshots: tuple[tuple[int, int, int], ...] = ()     # (step, rank among the step's sequences, sequence)

    @classmethod
    def build(cls, seq_lens: Sequence[int], chunk_size: int, keep_states: Sequence[bool] | None = None,
              device: torch.device | str = "cpu", snapshots: Sequence[int] | None = None) -> PackPlan:
        """Plan `seq_lens` (tokens packed in this order). `keep_states[n]`: sequence n needs its state after
        every position (then it must have <= chunk_size tokens) and no final state. `snapshots[n]` > 0: the
        state of sequence n after that many tokens is wanted too (a multiple of chunk_size, at most its
        length; sequences past the list's end want none)."""
        seq_lens = tuple(int(x) for x in seq_lens)
        keep = tuple(bool(x) for x in keep_states) if keep_states is not None else (False,) * len(seq_lens)
        if chunk_size < 1:
            raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
        if len(keep) != len(seq_lens):
            raise ValueError(f"keep_states: expected {len(seq_lens)} flags (one per sequence), got {len(keep)}")
        for n, (length, kept) in enumerate(zip(seq_lens, keep, strict=True)):
            if length < 0:
                raise ValueError(f"seq_lens[{n}]: must be >= 0, got {length}")
            if kept and length > chunk_size:
                raise ValueError(f"seq_lens[{n}]: a sequence that keeps per-position states needs <= chunk_size "
                                 f"({chunk_size}) tokens, got {length}")
        starts = [0]
        for length in seq_lens:
            starts.append(starts[-1] + length)
        num_full = [0 if kept else length // chunk_size for length, kept in zip(seq_lens, keep, strict=True)]
        full_seqs = sorted((n for n in range(len(seq_lens)) if num_full[n]), key=lambda n: -num_full[n])
        steps, rows = [], []
        for j in range(num_full[full_seqs[0]] if full_seqs else 0):
            active = [n for n in full_seqs if num_full[n] > j]
            steps.append((len(rows), len(active)))
            rows.extend(starts[n] + j * chunk_size for n in active)
        arange = torch.arange(chunk_size, device=device)
        full_tokens = torch.tensor(rows, dtype=torch.long, device=device)[:, None] + arange
        groups: dict[tuple[int, bool], list[int]] = {}
        for n, (length, kept) in enumerate(zip(seq_lens, keep, strict=True)):
            tail = length - num_full[n] * chunk_size
            if tail:
                groups.setdefault((tail, kept), []).append(n)
        tails = tuple(
            TailGroup(length, tuple(ids),
                      torch.tensor([starts[n] + num_full[n] * chunk_size for n in ids], dtype=torch.long,
                                   device=device)[:, None] + torch.arange(length, device=device),
                      kept)
            for (length, kept), ids in sorted(groups.items()))
        state_offsets = [0]
        for length, kept in zip(seq_lens, keep, strict=True):
            state_offsets.append(state_offsets[-1] + (length if kept else 0))
        rank = {n: i for i, n in enumerate(full_seqs)}
        taken = []
        for n, offset in enumerate(snapshots or ()):
            if not offset:
                continue
            if n >= len(seq_lens) or keep[n] or offset < 0 or offset % chunk_size or offset > num_full[n] * chunk_size:
                raise ValueError(f"snapshots[{n}]: invalid value {offset!r}; valid: 0, or a multiple of chunk_size "
                                 f"({chunk_size}) up to the sequence's length "
                                 f"({seq_lens[n] if n < len(seq_lens) else 'none'}), not on a kept-state row")
            taken.append((offset // chunk_size - 1, rank[n], n))
        return cls(seq_lens, chunk_size, tuple(full_seqs), tuple(steps), full_tokens, tails,
                   tuple(state_offsets), tuple(sorted(taken)))

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_kept_states(self) -> int:
        return self.state_offsets[-1]


class StateRows:
    """Per-sequence rows spread over several [n_i, H, dk, dv] tensors (sequence numbers run across them)."""

    def __init__(self, parts: Sequence[torch.Tensor | None], counts: Sequence[int] | None = None) -> None:
        self.parts = list(parts)
        counts = [p.shape[0] for p in parts] if counts is None else list(counts)
        if len(counts) != len(self.parts) or any(
                p is not None and p.shape[0] != c for p, c in zip(self.parts, counts, strict=True)):
            raise ValueError(f"final_out: expected parts of {counts} rows like initial_states, got "
                             f"{[None if p is None else p.shape[0] for p in self.parts]}")
        self.where: list[tuple[int, int]] = []
        for p, count in enumerate(counts):
            self.where.extend((p, r) for r in range(count))

    def has(self, seq: int) -> bool:
        return self.parts[self.where[seq][0]] is not None

    def _span(self, seq_ids: Sequence[int]) -> tuple[int, int] | None:
        p, r0 = self.where[seq_ids[0]]
        if all(self.where[s] == (p, r0 + i) for i, s in enumerate(seq_ids)):
            return p, r0
        return None

    def read(self, seq_ids: Sequence[int]) -> torch.Tensor:
        """The rows of `seq_ids`, a view when they are consecutive in one part, else a stacked copy."""
        span = self._span(seq_ids)
        if span is not None:
            p, r0 = span
            return self.parts[p][r0:r0 + len(seq_ids)]
        return torch.stack([self.parts[self.where[s][0]][self.where[s][1]] for s in seq_ids])

    def write(self, seq_ids: Sequence[int], values: torch.Tensor) -> None:
        """Copy `values` [len(seq_ids), ...] into the rows of `seq_ids` (those whose part is not None)."""
        span = self._span(seq_ids)
        if span is not None and self.parts[span[0]] is not None:
            self.parts[span[0]][span[1]:span[1] + len(seq_ids)].copy_(values)
            return
        for i, s in enumerate(seq_ids):
            p, r = self.where[s]
            if self.parts[p] is not None:
                self.parts[p][r].copy_(values[i])


def chunk_kda_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     plan: PackPlan, initial_states: Sequence[torch.Tensor], *, scale: float,
                     o_out: torch.Tensor, final_out: Sequence[torch.Tensor | None],
                     states_out: torch.Tensor | None = None, snapshots_out: torch.Tensor | None = None) -> None:
    """Run `plan` over packed tokens q, k, g [T, H, dk], v [T, H, dv], beta [T, H]; g <= 0 (log decays).

    `initial_states`: tensors [n_i, H, dk, dv] whose rows, in order, are the N sequences' starting states.
    Writes o into `o_out` [T, H, dv]; final states into `final_out` (same split as `initial_states`, None
    where not wanted; kept-state sequences are skipped); per-position states of kept-state sequences into
    `states_out` [plan.num_kept_states, H, dk, dv], sequences in order; each planned snapshot of sequence n
    into row n of `snapshots_out` [>n, H, dk, dv].
    """
    initial = StateRows(initial_states)
    finals = StateRows(final_out, [x.shape[0] for x in initial_states])
    if len(initial.where) != plan.num_seqs or len(finals.where) != plan.num_seqs:
        raise ValueError(f"initial_states / final_out: need {plan.num_seqs} rows in all (one per sequence), "
                         f"got {len(initial.where)} / {len(finals.where)}")
    if plan.num_kept_states and (states_out is None or states_out.shape[0] != plan.num_kept_states):
        raise ValueError(f"states_out: expected {plan.num_kept_states} rows (one per kept position), got "
                         f"{None if states_out is None else tuple(states_out.shape)}")
    if plan.snapshots and (snapshots_out is None or snapshots_out.shape[0] <= max(n for *_, n in plan.snapshots)):
        raise ValueError(f"snapshots_out: expected a row for sequence {max(n for *_, n in plan.snapshots)}, got "
                         f"{None if snapshots_out is None else tuple(snapshots_out.shape)}")
    ct = torch.float64 if torch.float64 in (q.dtype, *(s.dtype for s in initial_states)) else torch.float32
    if g.numel() and g.max() > 0:
        raise ValueError(f"g: KDA log decays must be <= 0, got a maximum of {float(g.max()):.3g}")
    after_full: torch.Tensor | None = None
    rank = {n: i for i, n in enumerate(plan.full_seqs)}
    if plan.steps:
        after_full = _run_full_chunks(q, k, v, g, beta, plan, initial, scale, ct, o_out, snapshots_out)
        done = [n for n in plan.full_seqs if plan.seq_lens[n] % plan.chunk_size == 0]
        for n in done:
            if finals.has(n):
                finals.write([n], after_full[rank[n]][None])
    for group in plan.tails:
        if after_full is not None and any(n in rank for n in group.seq_ids):
            starts = torch.stack([after_full[rank[n]] if n in rank else initial.read([n])[0].to(ct)
                                  for n in group.seq_ids])
        else:
            starts = initial.read(group.seq_ids)
        _run_tails(q, k, v, g, beta, group, starts, scale, ct, o_out, finals, states_out, plan)
    for n, length in enumerate(plan.seq_lens):
        if length == 0 and finals.has(n):
            finals.write([n], initial.read([n]))


def _gather(x: torch.Tensor, tokens: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
    """[T, H, ...] -> [n, H, L, ...] for token indices [n, L], in compute dtype."""
    n, length = tokens.shape
    rows = x.index_select(0, tokens.flatten()).view(n, length, *x.shape[1:])
    return rows.transpose(1, 2).to(ct, memory_format=torch.contiguous_format)


def _scatter(o_out: torch.Tensor, tokens: torch.Tensor, o: torch.Tensor) -> None:
    """o [n, H, L, dv] back to the rows `tokens` [n, L] of o_out [T, H, dv]."""
    rows = o.transpose(1, 2).to(o_out.dtype).reshape(-1, *o_out.shape[1:])
    o_out.index_copy_(0, tokens.flatten(), rows)


def _run_full_chunks(q, k, v, g, beta, plan: PackPlan, initial: StateRows, scale, ct, o_out, snapshots_out=None):
    tokens = plan.full_tokens
    c = plan.chunk_size
    n_chunks = tokens.shape[0]
    h = q.shape[1]
    wq = torch.empty(n_chunks, h, 2 * c, q.shape[2], dtype=ct, device=q.device)
    u = torch.empty(n_chunks, h, c, v.shape[2], dtype=ct, device=q.device)
    a_qk = torch.empty(n_chunks, h, c, c, dtype=ct, device=q.device)
    k_end = torch.empty(n_chunks, h, c, k.shape[2], dtype=ct, device=q.device)
    decay_end = torch.empty(n_chunks, h, k.shape[2], dtype=ct, device=q.device)
    per_slab = max(1, SLAB_SCALARS // (h * c * (q.shape[2] + v.shape[2])))
    for s0 in range(0, n_chunks, per_slab):
        sl = slice(s0, min(s0 + per_slab, n_chunks))
        tk = tokens[sl]
        intra = _intra(_gather(q, tk, ct), _gather(k, tk, ct), _gather(v, tk, ct),
                       _gather(g, tk, ct), _gather(beta, tk, ct), scale)
        wq[sl], u[sl], a_qk[sl], k_end[sl], decay_end[sl] = intra
    state = torch.stack([initial.read([n])[0] for n in plan.full_seqs]).to(ct)
    o = torch.empty(n_chunks, h, c, v.shape[2], dtype=ct, device=q.device)
    dk, dv = q.shape[2], v.shape[2]
    taken = {}
    for j, r, n in plan.snapshots:
        taken.setdefault(j, []).append((r, n))
    for j, (off, count) in enumerate(plan.steps):
        sl = slice(off, off + count)
        s = state[:count].view(count * h, dk, dv)
        x = torch.bmm(wq[sl].view(count * h, 2 * c, dk), s)                      # [W; q·e^γ] @ S
        delta = u[sl].view(count * h, c, dv).sub_(x[:, :c])                       # corrected values
        torch.baddbmm(x[:, c:], a_qk[sl].view(count * h, c, c), delta, out=o[sl].view(count * h, c, dv))
        s.mul_(decay_end[sl].view(count * h, dk, 1))
        s.baddbmm_(k_end[sl].view(count * h, c, dk).transpose(1, 2), delta)
        for r, n in taken.get(j, ()):
            snapshots_out[n].copy_(state[r])
    _scatter(o_out, tokens, o)
    return state


def _run_tails(q, k, v, g, beta, group: TailGroup, starts, scale, ct, o_out, finals: StateRows,
               states_out, plan: PackPlan):
    tk = group.tokens
    n, length = tk.shape
    h, dk, dv = q.shape[1], q.shape[2], v.shape[2]
    kg, gg = _gather(k, tk, ct), _gather(g, tk, ct)
    wq, u, a_qk, k_end, decay_end = _intra(_gather(q, tk, ct), kg, _gather(v, tk, ct), gg,
                                           _gather(beta, tk, ct), scale)
    s = starts.to(ct) if starts.dtype != ct else starts
    if not group.keep_states:
        x = torch.matmul(wq, s)                                                   # [n, H, 2L, dv]
        delta = u.sub_(x[:, :, :length])
        _scatter(o_out, tk, torch.matmul(a_qk, delta).add_(x[:, :, length:]))
        end = torch.matmul(k_end.transpose(-1, -2), delta).addcmul_(decay_end[..., None], s)
        finals.write(group.seq_ids, end)
        return
    # A few rows at a time: their corrected values δ from the chunk form, then the state after every position
    # by S_t = e^{g_t} ⊙ S_{t-1} + k_t δ_tᵀ, each S_t written once, straight into its slot while S_{t-1} is in cache.
    step_decay = gg.exp_()                                                        # [n, H, L, dk]
    offsets = [plan.state_offsets[sid] for sid in group.seq_ids]
    consecutive = all(b - a == length for a, b in itertools.pairwise(offsets))
    dst = (states_out[offsets[0]:offsets[0] + n * length].view(n, length, h, dk, dv) if consecutive
           else torch.empty(n, length, h, dk, dv, dtype=states_out.dtype, device=q.device))
    o = torch.empty(n, h, length, dv, dtype=ct, device=q.device)
    per_slab = max(1, SLAB_STATE_BYTES // (h * dk * dv * dst.element_size()))
    for a in range(0, n, per_slab):
        b = min(a + per_slab, n)
        x = torch.matmul(wq[a:b], s[a:b])
        delta = u[a:b].sub_(x[:, :, :length])
        torch.matmul(a_qk[a:b], delta, out=o[a:b]).add_(x[:, :, length:])
        prev = s[a:b]
        for t in range(length):
            slot = dst[a:b, t]
            torch.mul(prev, step_decay[a:b, :, t, :, None], out=slot)
            slot.addcmul_(kg[a:b, :, t, :, None], delta[:, :, t, None, :])
            prev = slot
    _scatter(o_out, tk, o)
    if not consecutive:
        for i, off in enumerate(offsets):
            states_out[off:off + length].copy_(dst[i])


def _intra(q, k, v, g, beta, scale):
    """Intra-chunk work for chunks [..., L, D]: [W; scale·q·e^γ], U, A_qk, k·e^{γ_L−γ}, e^{γ_L}."""
    dv = v.shape[-1]
    gam = g.cumsum(-2)
    a_kk, a_qk = _scores(q, k, gam, scale)
    a_kk.mul_(beta[..., None])
    eg = gam.exp()
    rhs = torch.cat([v, eg * k], dim=-1).mul_(beta[..., None])
    eye = torch.eye(a_kk.shape[-1], dtype=a_kk.dtype, device=a_kk.device).expand_as(a_kk)
    inverse = torch.linalg.solve_triangular(a_kk, eye, upper=False, unitriangular=True)  # (I + A_kk)⁻¹
    sol = torch.matmul(inverse, rhs)
    u, w = sol[..., :dv], sol[..., dv:]
    wq = torch.cat([w, eg.mul_(q).mul_(scale)], dim=-2)
    last = gam[..., -1:, :]
    k_end = (last - gam).exp_().mul_(k)
    return wq, u, a_qk, k_end, last[..., 0, :].exp()


def _pairwise(k, gam):
    """k_i·e^{γ_t − γ_i} for i <= t, 0 above: [..., t, i, dk]. Exact for any decay, L²·dk work."""
    length = gam.shape[-2]
    pos = torch.arange(length, device=gam.device)
    later = (pos[None, :] > pos[:, None])[..., None]
    weights = (gam[..., :, None, :] - gam[..., None, :, :]).masked_fill_(later, float("-inf"))
    return weights.exp_().mul_(k[..., None, :, :])


def _scores(q, k, gam, scale):
    """(A_kk, A_qk) [..., L, L]: Σ_d k_t k_i e^{γ_t − γ_i} for i < t, and scale·Σ_d q_t k_i e^{γ_t − γ_i}, i <= t.

    Subchunks of up to 16 rows share a reference point r (the subchunk's first γ): (x_t e^{γ_t − r})·(k_i e^{r − γ_i})
    is one matmul per subchunk; both factors stay finite while a subchunk's decay span is below MAX_SPAN, and
    beyond it the pairwise form (L²·dk exponentials) takes over.
    """
    scores = _factored_scores(q, k, gam)
    if scores is not None:
        return scores[0].tril_(-1), scores[1].tril_().mul_(scale)
    weights = _pairwise(k, gam)                                                   # [..., t, i, dk]
    a_kk = (weights * k[..., :, None, :]).sum(-1).tril_(-1)
    return a_kk, weights.mul_(q[..., :, None, :]).sum(-1).mul_(scale)


def _factored_scores(q, k, gam):
    length = gam.shape[-2]
    size = min(length, SUBCHUNK)
    m = -(-length // size)
    padded = m * size
    if padded != length:
        pad = padded - length
        q, k = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k))
        gam = torch.cat([gam, gam[..., -1:, :].expand(*gam.shape[:-2], pad, gam.shape[-1])], dim=-2)
    sub = gam.unflatten(-2, (m, size))                                              # [..., m, S, dk]
    ref = sub[..., :1, :]                                                           # r_a: each subchunk's first γ
    if float((ref[..., 0, :] - sub[..., -1, :]).amax()) > MAX_SPAN:
        return None
    grow = (ref - sub).exp_()                                                       # e^{r_b − γ_i}, <= e^{span}
    left = torch.reciprocal(grow)                                                   # e^{γ_t − r_a}, <= 1
    rows = torch.cat([left * k.unflatten(-2, (m, size)), left.mul_(q.unflatten(-2, (m, size)))],
                     dim=-2)                                                       # [..., m, 2S, dk]
    cols = grow.mul_(k.unflatten(-2, (m, size)))                                    # k_i e^{r_b − γ_i}
    if m > 1:
        # subchunk a sees subchunk b <= a through e^{r_a − r_b} <= 1: cols_a = [k_i e^{r_a − γ_i}]_{i < (a+1)S}
        r = ref[..., 0, :]
        blocks = torch.arange(m, device=gam.device)
        later = (blocks[None, :] > blocks[:, None])[..., None]
        bridge = (r[..., :, None, :] - r[..., None, :, :]).masked_fill_(later, float("-inf")).exp_()
        cols = (bridge[..., :, :, None, :] * cols[..., None, :, :, :]).flatten(-3, -2)  # [..., m, Lp, dk]
    scores = torch.matmul(rows, cols.transpose(-1, -2))                             # [..., m, 2S, Lp]
    a_kk = scores[..., :size, :].flatten(-3, -2)[..., :length, :length]
    a_qk = scores[..., size:, :].flatten(-3, -2)[..., :length, :length]
    return a_kk, a_qk
