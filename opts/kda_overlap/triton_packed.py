"""On, as a Triton kernel: one launch over a mixed step's prefill segments and verification rows.

One program per (sequence, head), the grid [N, H] over the packed order of `MixedStep.seq_lens`. A prefill
segment runs the chunked form chunk by chunk (`BT` tokens each, the state carried from one chunk to the next
in registers); a verification row runs the delta rule position by position and writes the state after every
position into its slot (`StepOutput.verify_states`), as `packed.py` keeps them; a prefill segment with a
checkpoint offset (a multiple of BT) writes its state after that many tokens too (ROCm's prefill checkpoints).
The math is README.md's;
per chunk with cumulative log decays gamma (c: the chunk's last row, padded rows carry no decay):

    A[t, i]   = beta_t sum_d k_t k_i e^{gamma_t - gamma_i}      (i < t)
    [U | W]   = (I + A)^-1 [beta v | beta e^{gamma} k]          (forward substitution, row by row)
    delta     = U - W S
    o         = scale (q e^{gamma}) S + A_qk delta,   A_qk[t, i] = scale sum_d q_t k_i e^{gamma_t - gamma_i} (i <= t)
    S        <- e^{gamma_c} * S + (k e^{gamma_c - gamma})^T delta

Every exponent above is <= 0 (gamma falls along a chunk), so the pairwise form is exact for any decay: no
sub-chunk reference point, no fallback (`packed.py`'s MAX_SPAN). It costs BT^2 dk per chunk in registers;
a factored form is the speed-up to try where a GPU can measure it. Computed in fp32 (`tl.dot` in IEEE
precision, not TF32), the states in fp32.

Written the way vLLM's and flash-linear-attention's KDA kernels are (varlen by `cu_seqlens`, one program per
sequence and head, state tiles [dk, dv] in registers), not copied from them. Runs on CUDA and ROCm, and on
a CPU under TRITON_INTERPRET=1 (the tests); `packed_step` checks the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from opts.kda_overlap.batch import MixedStep, StepOutput

BT = 16     # tokens per chunk: tl.dot's smallest tile; the pairwise scores hold BT * BT * dk values


@triton.jit
def packed_kda_kernel(q, k, v, g, beta, o, h0, ht, hs, hc, cu_seqlens, keep, state_offsets, checkpoints, scale,
                      H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr):
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    seq_len = eos - bos
    o_k, o_v = tl.arange(0, K), tl.arange(0, V)
    tile = o_k[:, None] * V + o_v[None, :]
    s = tl.load(h0 + (i_n * H + i_h).to(tl.int64) * K * V + tile).to(tl.float32)     # [K, V]
    if tl.load(keep + i_n) != 0:
        # a verification row: the delta rule at every position, each position's state written to its slot
        slot = tl.load(state_offsets + i_n).to(tl.int64)
        for t in range(0, seq_len):
            row = (bos + t) * H + i_h
            b_q = tl.load(q + row * K + o_k).to(tl.float32)
            b_k = tl.load(k + row * K + o_k).to(tl.float32)
            b_d = tl.exp(tl.load(g + row * K + o_k).to(tl.float32))
            b_v = tl.load(v + row * V + o_v).to(tl.float32)
            b_beta = tl.load(beta + row).to(tl.float32)
            s = s * b_d[:, None]                                         # e^{g_t} * S_{t-1}
            delta = (b_v - tl.sum(b_k[:, None] * s, 0)) * b_beta         # beta (v - (D S)^T k)
            s = s + b_k[:, None] * delta[None, :]
            b_o = tl.sum(b_q[:, None] * s, 0) * scale                    # S_t^T q
            tl.store(o + row * V + o_v, b_o.to(o.dtype.element_ty))
            tl.store(hs + ((slot + t) * H + i_h) * K * V + tile, s)
    else:
        checkpoint = tl.load(checkpoints + i_n).to(tl.int64)             # 0: none
        loc = tl.arange(0, BT)
        causal = loc[None, :] <= loc[:, None]                            # [t, i]: i <= t
        strict = loc[None, :] < loc[:, None]
        for i_c in range(0, tl.cdiv(seq_len, BT)):
            pos = i_c * BT + loc
            live = pos < seq_len
            rows = (bos + pos) * H + i_h
            b_q = tl.load(q + rows[:, None] * K + o_k[None, :], mask=live[:, None], other=0.).to(tl.float32)
            b_k = tl.load(k + rows[:, None] * K + o_k[None, :], mask=live[:, None], other=0.).to(tl.float32)
            b_g = tl.load(g + rows[:, None] * K + o_k[None, :], mask=live[:, None], other=0.).to(tl.float32)
            b_v = tl.load(v + rows[:, None] * V + o_v[None, :], mask=live[:, None], other=0.).to(tl.float32)
            b_beta = tl.load(beta + rows, mask=live, other=0.).to(tl.float32)
            gam = tl.cumsum(b_g, 0)                                      # [BT, K]
            span = tl.where(causal[:, :, None], gam[:, None, :] - gam[None, :, :], float("-inf"))
            decay = tl.exp(span)                                         # [t, i, K], 0 above the diagonal
            a_kk = tl.where(strict, tl.sum(b_k[:, None, :] * b_k[None, :, :] * decay, 2), 0.) * b_beta[:, None]
            a_qk = tl.sum(b_q[:, None, :] * b_k[None, :, :] * decay, 2) * scale
            e_gam = tl.exp(gam)
            u = b_v * b_beta[:, None]                                    # [BT, V]
            w = e_gam * b_k * b_beta[:, None]                            # [BT, K]
            for t in tl.static_range(1, BT):                             # (I + A) X = rhs, row t from rows < t
                here = loc == t
                a_t = tl.sum(tl.where(here[:, None], a_kk, 0.), 0)       # row t of A (0 from column t on)
                u_t = tl.sum(tl.where(here[:, None], u, 0.), 0) - tl.sum(a_t[:, None] * u, 0)
                w_t = tl.sum(tl.where(here[:, None], w, 0.), 0) - tl.sum(a_t[:, None] * w, 0)
                u = tl.where(here[:, None], u_t[None, :], u)
                w = tl.where(here[:, None], w_t[None, :], w)
            delta = u - tl.dot(w, s, input_precision="ieee")
            b_o = tl.dot(e_gam * b_q, s, input_precision="ieee") * scale + tl.dot(a_qk, delta, input_precision="ieee")
            tl.store(o + rows[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=live[:, None])
            last = tl.sum(tl.where((loc == BT - 1)[:, None], gam, 0.), 0)   # gamma_c (padded rows add no decay)
            k_end = b_k * tl.exp(last[None, :] - gam)
            s = s * tl.exp(last)[:, None] + tl.dot(tl.trans(k_end), delta, input_precision="ieee")
            if (i_c + 1) * BT == checkpoint:
                tl.store(hc + (i_n * H + i_h).to(tl.int64) * K * V + tile, s)
        tl.store(ht + (i_n * H + i_h).to(tl.int64) * K * V + tile, s)


def interpreted() -> bool:
    """Whether the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 when this module was imported)."""
    return not isinstance(packed_kda_kernel, triton.runtime.jit.JITFunction)


def _power_of_two(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


def packed_step(batch: MixedStep, out: StepOutput | None = None, checkpoints: Sequence[int] = (),
                checkpoints_out: torch.Tensor | None = None) -> StepOutput:
    """`step.step_on`'s function in one Triton launch: o, the prefill segments' final states, every
    verification position's state and the checkpoints (`step.step_on`'s). Needs dk and dv powers of two >= 16,
    and a CUDA / ROCm device (or TRITON_INTERPRET=1 on a CPU)."""
    for i, c in enumerate(checkpoints):
        if c < 0 or c % BT or c > batch.prefill_lens[i]:
            raise ValueError(f"checkpoints[{i}]: invalid value {c!r}; valid: 0, or a multiple of {BT} (the kernel's "
                             f"chunk) up to the segment's {batch.prefill_lens[i]} tokens")
    for name, size in (("dk", batch.dk), ("dv", batch.dv)):
        if not _power_of_two(size):
            raise ValueError(f"MixedStep.{name}: the Triton packed kernel needs a power of two >= 16, got {size}")
    if batch.q.device.type == "cpu" and not interpreted():
        raise ValueError("kda_overlap Triton kernel: the step is on the CPU; it runs on CUDA / ROCm, or on a CPU "
                         "with TRITON_INTERPRET=1 set before this module is imported")
    if out is None:
        out = StepOutput.empty(batch)
    out.check_fits(batch)
    dev, n, h = batch.q.device, len(batch.seq_lens), batch.num_heads
    bounds = torch.tensor(batch.token_bounds, dtype=torch.int32, device=dev)
    keep = torch.tensor([0] * batch.num_prefill + [1] * batch.num_verify, dtype=torch.int32, device=dev)
    offsets = torch.tensor([0] * batch.num_prefill + batch.verify_bounds[:-1], dtype=torch.int32, device=dev)
    h0 = torch.cat([batch.prefill_state, batch.verify_state]).to(torch.float32).contiguous()
    ht = torch.empty_like(h0)
    marks = list(checkpoints) + [0] * (n - len(checkpoints))
    marks_t = torch.tensor(marks, dtype=torch.int32, device=dev)
    hc = torch.empty_like(h0) if any(marks) else ht
    fp32 = out.verify_states.dtype == torch.float32
    hs = out.verify_states if fp32 else torch.empty_like(out.verify_states, dtype=torch.float32)
    if n:
        tokens = [x.contiguous() for x in (batch.q, batch.k, batch.v, batch.g, batch.beta)]
        packed_kda_kernel[(n, h)](*tokens, out.o, h0, ht, hs, hc, bounds, keep, offsets, marks_t,
                                  float(batch.resolved_scale), H=h, K=batch.dk, V=batch.dv, BT=BT)
    out.prefill_final_state.copy_(ht[:batch.num_prefill])
    for i, c in enumerate(checkpoints):
        if c:
            checkpoints_out[i].copy_(hc[i])
    if not fp32:
        out.verify_states.copy_(hs)
    return out
