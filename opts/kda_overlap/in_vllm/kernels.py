"""KDA in vLLM's kernel conventions over this package's off and on code.

vLLM's K3 KDA kernels (vllm/models/kimi_k3/nvidia/ops/third_party/kda) differ from the package's form:

- tokens are [1, T, H, D]; the recurrent state cache is [slots, H, dv, dk] (ours: [.., dk, dv]);
- the gate arrives raw (`opts.k3.kda_gate`: lower_bound·σ(e^A·(raw+dt_bias)), else −e^A·softplus(raw+dt_bias));
  β arrives as a logit; q and k are L2-normalised in the kernel (x / sqrt(Σx² + 1e-6));
- a verification row n starts from slot `ssm_state_indices[n, num_accepted[n]-1]` (column 0 without
  num_accepted) and writes the state after its token t into slot `ssm_state_indices[n, t]` when > 0; a row
  whose starting slot is <= 0 (the null block; also num_accepted <= 0) reads and writes no state and outputs
  zeros on every token.

ROCm's prefill kernel, `chunk_kda_prefill` (vllm/models/kimi_k3/amd/ops/kda_prefill.py), takes the paged cache
itself: sequence n starts from row `state_indices[n]` (zeros where `has_initial_state[n]` is false) and its final
state goes back there; with `checkpoint_offsets[n] > 0` the state after that many of its tokens also goes to row
`checkpoint_state_indices[n]` of `checkpoint_state` (row n without indices; none where the index is < 0).

`Prefill` and `Verify` turn one call's arguments into the package's tensors. `chunk_kda_with_fused_gate`,
`chunk_kda_prefill` and `fused_recurrent_kda` have vLLM's signatures and run off (`naive.step_off`: verification
rows through the batched recurrent form, prefill through the packed chunked form); `mixed_on` runs one call of
each as the single packed pass of `step.step_on`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from opts.k3 import kda_gate, l2_normalize
from opts.kda_overlap.batch import MixedStep
from opts.kda_overlap.naive import CHUNK_SIZE, step_off
from opts.kda_overlap.step import step_on

# vLLM's null block (`v1/attention/backends/utils.py:52`) and the ROCm prefill kernel's checkpoint grid
# (`amd/ops/kda_chunk.py:23`, its chunk of 64 tokens)
NULL_BLOCK_ID = 0
CHECKPOINT_ALIGNMENT = 64

__all__ = ["Prefill", "Verify", "chunk_kda_prefill", "chunk_kda_with_fused_gate", "fused_recurrent_kda", "mixed_on",
           "prefill_off", "verify_off"]


def _tokens(x: torch.Tensor, name: str) -> torch.Tensor:
    if x.shape[0] != 1:
        raise ValueError(f"{name}: expected a batch of 1 ([1, T, ...], sequences packed along T), got shape "
                         f"{tuple(x.shape)}")
    return x[0]


def _activate(q, k, raw_g, raw_beta, A_log, dt_bias, lower_bound, l2norm: bool):
    """(q, k, g, β) fp32 from vLLM's inputs [T, H, D] / raw β [T, H]."""
    q, k = q.float(), k.float()
    if l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    return q, k, kda_gate(raw_g, A_log, dt_bias, lower_bound), torch.sigmoid(raw_beta.float())


def _check_scale(scale: float | None, dk: int, where: str) -> None:
    if scale is not None and scale != dk ** -0.5:
        raise NotImplementedError(f"{where}: only scale=dk**-0.5 is supported, got {scale}")


@dataclass(frozen=True)
class Prefill:
    """One `chunk_kda_with_fused_gate` call as the package's tensors: q, k, g [T, H, dk], v [T, H, dv],
    beta [T, H] (fp32, activated), `seq_lens` (from cu_seqlens; 0 allowed) and `initial_state` [N, H, dk, dv]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    seq_lens: tuple[int, ...]
    initial_state: torch.Tensor

    @classmethod
    def from_vllm(cls, q, k, v, raw_g, raw_beta, A_log, g_bias, *, scale=None, initial_state=None, lower_bound=None,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None) -> Prefill:
        """From `chunk_kda_with_fused_gate`'s arguments (initial_state [N, H, dv, dk], None: zeros)."""
        q, k, v = _tokens(q, "q"), _tokens(k, "k"), _tokens(v, "v")
        _check_scale(scale, q.shape[-1], "chunk_kda_with_fused_gate")
        q, k, g, beta = _activate(q, k, _tokens(raw_g, "raw_g"), _tokens(raw_beta, "raw_beta"), A_log, g_bias,
                                  lower_bound, use_qk_l2norm_in_kernel)
        if cu_seqlens is None:
            seq_lens = (q.shape[0],)
        else:
            bounds = cu_seqlens.tolist()
            seq_lens = tuple(b - a for a, b in itertools.pairwise(bounds))
        h, dk, dv = q.shape[1], q.shape[2], v.shape[2]
        h0 = (torch.zeros(len(seq_lens), h, dk, dv, dtype=torch.float32, device=q.device) if initial_state is None
              else initial_state.float().transpose(-1, -2))
        return cls(q, k, v.float(), g, beta, seq_lens, h0)


@dataclass(frozen=True)
class Verify:
    """One `fused_recurrent_kda` call's live rows as the package's tensors: q, k, g [T_live, H, dk],
    v [T_live, H, dv], beta [T_live, H] (fp32, activated), `row_lens` and `initial_state` [R, H, dk, dv] of
    the live rows; where their outputs go (`live_tokens`, and `null_tokens`, zeroed) in the call's tokens;
    which per-position state goes to which cache slot (`state_positions` -> `state_slots`)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    row_lens: tuple[int, ...]
    initial_state: torch.Tensor
    live_tokens: torch.Tensor
    null_tokens: torch.Tensor
    state_positions: torch.Tensor
    state_slots: torch.Tensor

    @classmethod
    def from_vllm(cls, q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                  ssm_state_indices, num_accepted_tokens=None) -> Verify:
        """From `fused_recurrent_kda`'s arguments; `initial_state` is the cache [slots, H, dv, dk]."""
        slots = (ssm_state_indices if ssm_state_indices.ndim == 2 else ssm_state_indices.view(-1, 1)).tolist()
        bounds = cu_seqlens.tolist()
        accepted = None if num_accepted_tokens is None else num_accepted_tokens.tolist()
        live, null, row_lens, sources, positions, dests = [], [], [], [], [], []
        for n, (bos, eos) in enumerate(itertools.pairwise(bounds)):
            if eos == bos:
                continue
            column = 0 if accepted is None else accepted[n] - 1
            src = slots[n][column] if 0 <= column < len(slots[n]) else 0
            if src <= 0:
                null.extend(range(bos, eos))
                continue
            for t in range(eos - bos):
                if t < len(slots[n]) and slots[n][t] > 0:
                    positions.append(len(live) + t)
                    dests.append(slots[n][t])
            live.extend(range(bos, eos))
            row_lens.append(eos - bos)
            sources.append(src)
        device = q.device

        def index(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        tokens = index(live)
        q, k, v, raw_g, raw_beta = (_tokens(x, name).index_select(0, tokens) for x, name in (
            (q, "q"), (k, "k"), (v, "v"), (raw_g, "raw_g"), (raw_beta, "raw_beta")))
        q, k, g, beta = _activate(q, k, raw_g, raw_beta, A_log, dt_bias, lower_bound, True)
        h0 = initial_state[index(sources)].float().transpose(-1, -2)
        return cls(q, k, v.float(), g, beta, tuple(row_lens), h0, tokens, index(null), index(positions),
                   index(dests))

    def finish(self, o: torch.Tensor, states: torch.Tensor, out: torch.Tensor, cache: torch.Tensor) -> None:
        """Write the live rows' o [T_live, H, dv] and zeros for null rows into `out` [1, T, H, dv], and the kept
        per-position states [T_live, H, dk, dv] into their slots of `cache` [slots, H, dv, dk]."""
        out[0, self.live_tokens] = o.to(out.dtype)
        out[0, self.null_tokens] = 0
        cache[self.state_slots] = states[self.state_positions].transpose(-1, -2).to(cache.dtype)


def _step(prefill: Prefill | None, verify: Verify | None) -> MixedStep:
    parts = [x for x in (prefill, verify) if x is not None]
    ref = parts[0]
    h, dk, dv = ref.q.shape[1], ref.q.shape[2], ref.v.shape[2]

    def cat(name: str) -> torch.Tensor:
        xs = [getattr(x, name) for x in parts]
        return xs[0] if len(xs) == 1 else torch.cat(xs)

    def no_states() -> torch.Tensor:
        return torch.empty(0, h, dk, dv, dtype=torch.float32, device=ref.q.device)

    if prefill is None:
        prefill_lens, prefill_state = (), no_states()
    else:
        kept = [n for n, length in enumerate(prefill.seq_lens) if length]
        prefill_lens = tuple(prefill.seq_lens[n] for n in kept)
        prefill_state = (prefill.initial_state if len(kept) == len(prefill.seq_lens)
                         else prefill.initial_state[kept])
    verify_lens, verify_state = ((), no_states()) if verify is None else (verify.row_lens, verify.initial_state)
    return MixedStep(cat("q"), cat("k"), cat("v"), cat("g"), cat("beta"), prefill_lens, verify_lens,
                     prefill_state, verify_state)


def _prefill_finals(prefill: Prefill, finals: torch.Tensor) -> torch.Tensor:
    """Final states of every sequence [N, H, dk, dv]; a sequence of length 0 keeps its initial state."""
    if all(prefill.seq_lens):
        return finals
    kept = [n for n, length in enumerate(prefill.seq_lens) if length]
    full = prefill.initial_state.clone()
    full[kept] = finals
    return full


def prefill_off(prefill: Prefill, chunk_size: int = CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Off's prefill part: (o [T, H, dv], final states [N, H, dk, dv])."""
    out = step_off(_step(prefill, None), chunk_size=chunk_size)
    return out.o, _prefill_finals(prefill, out.prefill_final_state)


def verify_off(verify: Verify) -> tuple[torch.Tensor, torch.Tensor]:
    """Off's verification part: (o [T_live, H, dv], the state after every live position [T_live, H, dk, dv])."""
    out = step_off(_step(None, verify))
    return out.o, out.verify_states


def mixed_on(prefill: Prefill, verify: Verify, chunk_size: int = CHUNK_SIZE, checkpoints: Sequence[int] = (),
             checkpoints_out: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """On: one packed chunked pass over both calls' work. Returns (prefill o [T, H, dv], prefill final states
    [N, H, dk, dv], verification o [T_live, H, dv], verification states [T_live, H, dk, dv]).
    Verification rows need <= chunk_size tokens. `checkpoints[n]` > 0: prefill sequence n's state after that
    many tokens, from the same pass, into row n of `checkpoints_out` [N, H, dk, dv]."""
    step = _step(prefill, verify)
    kept = [n for n, length in enumerate(prefill.seq_lens) if length]
    marks = [checkpoints[n] if n < len(checkpoints) else 0 for n in kept]
    at = None
    if any(marks):
        at = torch.empty(step.num_prefill, *step.prefill_state.shape[1:], dtype=torch.float32, device=step.q.device)
    out = step_on(step, chunk_size=chunk_size, checkpoints=marks if at is not None else (), checkpoints_out=at)
    if at is not None:
        for i, n in enumerate(kept):
            if marks[i]:
                checkpoints_out[n].copy_(at[i])
    p = prefill.q.shape[0]
    return out.o[:p], _prefill_finals(prefill, out.prefill_final_state), out.o[p:], out.verify_states


def finish_prefill(o: torch.Tensor, finals: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
                   output_final_state: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """vLLM's return value: (out [1, T, H, dv] holding o, final states [N, H, dv, dk] or None)."""
    if out is None:
        out = torch.empty_like(v)
    out.copy_(o.unsqueeze(0).to(out.dtype))
    return out, (finals.transpose(-1, -2).contiguous() if output_final_state else None)


def chunk_kda_with_fused_gate(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=None, initial_state=None,
                              output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False,
                              cu_seqlens=None, out=None, **kwargs):
    """Off, as vLLM's chunked prefill kernel: (out [1, T, H, dv], final states [N, H, dv, dk] or None)."""
    prefill = Prefill.from_vllm(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                                lower_bound=lower_bound, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                cu_seqlens=cu_seqlens)
    o, finals = prefill_off(prefill)
    return finish_prefill(o, finals, v, out, output_final_state)


def fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                        ssm_state_indices, num_accepted_tokens=None, out=None, fuse_gate=None):
    """Off, as vLLM's speculative-verification kernel: (out [1, T, H, dv], the cache, updated in place)."""
    if out is None:
        out = torch.empty_like(v)
    verify = Verify.from_vllm(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                              ssm_state_indices, num_accepted_tokens)
    o, states = verify_off(verify)
    verify.finish(o, states, out, initial_state)
    return out, initial_state


def gather_states(state_cache: torch.Tensor, state_indices: torch.Tensor, has_initial_state: torch.Tensor
                  ) -> torch.Tensor:
    """The starting states [N, H, dv, dk] (vLLM's layout) of a ROCm prefill call: each sequence's cache row, or
    zeros where it has no initial state."""
    rows = state_cache[state_indices.long()].float()
    return torch.where(has_initial_state.view(-1, 1, 1, 1).bool(), rows, torch.zeros_like(rows))


def checkpoint_rows(checkpoint_offsets: torch.Tensor | None, checkpoint_state_indices: torch.Tensor | None,
                    seq_lens: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(sequence, offset, destination row) of every checkpoint a ROCm prefill call writes: as its kernel, none
    where the offset is 0, off the 64-token grid or past the sequence, nor where the row is the null block (0) or
    negative (`amd/ops/kda_chunk.py:32-38`)."""
    if checkpoint_offsets is None:
        return []
    offsets = checkpoint_offsets.tolist()
    if checkpoint_state_indices is None:
        rows = list(range(len(seq_lens)))
    else:
        rows = [r if r != NULL_BLOCK_ID else -1 for r in checkpoint_state_indices.tolist()]
    return [(n, c, r) for n, (c, r) in enumerate(zip(offsets, rows, strict=True))
            if 0 < c <= seq_lens[n] and c % CHECKPOINT_ALIGNMENT == 0 and r >= 0]


def check_cache_arguments(initial_state, output_final_state, state_cache, state_indices, has_initial_state) -> None:
    """The ROCm prefill kernel's own checks of its paged-cache arguments (`amd/ops/kda_prefill.py:113-117`)."""
    if state_cache is None:
        return
    if initial_state is not None or output_final_state:
        raise ValueError("state_cache replaces initial_state/output_final_state")
    if state_indices is None or has_initial_state is None:
        raise ValueError("state_cache needs state_indices and has_initial_state")


def prefix_states(prefill: Prefill, lengths: list[int]) -> torch.Tensor:
    """The state [N, H, dk, dv] of each sequence after its first `lengths[n]` tokens (0: its initial state)."""
    bounds = [0, *itertools.accumulate(prefill.seq_lens)]
    tokens = torch.tensor([t for n, c in enumerate(lengths) for t in range(bounds[n], bounds[n] + c)],
                          dtype=torch.long, device=prefill.q.device)
    head = Prefill(*(x.index_select(0, tokens) for x in (prefill.q, prefill.k, prefill.v, prefill.g, prefill.beta)),
                   tuple(lengths), prefill.initial_state)
    return prefill_off(head)[1]


def rocm_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, *, scale, initial_state, output_final_state, lower_bound,
                 use_qk_l2norm_in_kernel, cu_seqlens, state_cache, state_indices, has_initial_state) -> Prefill:
    """One ROCm `chunk_kda_prefill` call as the package's tensors: its arguments checked as the kernel checks
    them, the starting states read from the paged cache when it is given."""
    check_cache_arguments(initial_state, output_final_state, state_cache, state_indices, has_initial_state)
    if state_cache is not None:
        initial_state = gather_states(state_cache, state_indices, has_initial_state)
    return Prefill.from_vllm(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                             lower_bound=lower_bound, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                             cu_seqlens=cu_seqlens)


def checkpoint_lengths(checkpoints: list[tuple[int, int, int]], num_seqs: int) -> list[int]:
    """Each sequence's checkpoint offset (`checkpoint_rows`), 0 where it has none."""
    lengths = [0] * num_seqs
    for n, c, _ in checkpoints:
        lengths[n] = c
    return lengths


def finish_rocm_prefill(o: torch.Tensor, finals: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None,
                        output_final_state: bool, state_cache: torch.Tensor | None,
                        state_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunk_kda_prefill`'s return value; with the paged cache the final states go back to their rows instead."""
    if state_cache is None:
        return finish_prefill(o, finals, v, out, output_final_state)
    state_cache[state_indices.long()] = finals.transpose(-1, -2).to(state_cache.dtype)
    return finish_prefill(o, finals, v, out, False)


def chunk_kda_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias=None, scale=None, initial_state=None,
                      output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                      chunk_indices=None, chunk_offsets=None, use_fused_chunk=False, out=None, checkpoint_state=None,
                      checkpoint_offsets=None, checkpoint_state_indices=None, state_cache=None, state_indices=None,
                      has_initial_state=None):
    """Off, as vLLM's ROCm prefill kernel: (out [1, T, H, dv], final states [N, H, dv, dk], or None when they
    went into `state_cache`); checkpoints written."""
    prefill = rocm_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, lower_bound=lower_bound,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                           state_cache=state_cache, state_indices=state_indices, has_initial_state=has_initial_state)
    o, finals = prefill_off(prefill)
    checkpoints = checkpoint_rows(checkpoint_offsets, checkpoint_state_indices, prefill.seq_lens)
    if checkpoints:
        lengths = checkpoint_lengths(checkpoints, len(prefill.seq_lens))
        write_checkpoints(checkpoint_state, checkpoints, prefix_states(prefill, lengths))
    return finish_rocm_prefill(o, finals, v, out, output_final_state, state_cache, state_indices)


def write_checkpoints(checkpoint_state: torch.Tensor, checkpoints: list[tuple[int, int, int]],
                      states: torch.Tensor) -> None:
    """Each checkpoint's state (`states[n]`, [.., dk, dv]) into its row of `checkpoint_state` [rows, H, dv, dk]."""
    for n, _, row in checkpoints:
        checkpoint_state[row] = states[n].transpose(-1, -2).to(checkpoint_state.dtype)
