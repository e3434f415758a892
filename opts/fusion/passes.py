"""On: the fused passes, in vLLM's calling conventions — what the fusion toggle's on patches run inside a
vLLM-CPU engine (`vllm.py`) and what the microbenchmark times (`cases.py`), one implementation per pass.

The math is `stages.py`'s and `opts.k3`'s:
- `q_kv_rms_norm_fused` has the signature of vLLM's `fused_q_kv_rmsnorm` (models/common/ops/fused_qk_rmsnorm.py):
  the q and kv latents as two views, two new output tensors;
- `kda_decode_slots_fused` reads the conv and recurrent states from vLLM's slot pools through the step's slot
  indices, as vLLM's fused decode kernels do (`ops.fused_kda_decode`, nvidia/kda.py:1012-1028), and writes
  them back there (`slots.py`).
Both are `dynamic.py` passes: any token count without a graph per count. Off's counterparts, in the same
conventions, are `naive.q_kv_rms_norm` and `naive.kda_decode_slots_unfused`.
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import slots as pools
from opts.fusion import stages
from opts.fusion.checks import check_q_kv_norm
from opts.fusion.dynamic import as_two_rows, dynamic


def _q_kv_norm_body(qr, kv, q_weight, kv_weight, eps: float):
    return k3.rms_norm_fp32(qr, q_weight, eps).to(qr.dtype), k3.rms_norm_fp32(kv, kv_weight, eps).to(kv.dtype)


# (body, per-token arguments) of each pass (dynamic.py)
Q_KV_NORM_PASS = (_q_kv_norm_body, (0, 1))


def q_kv_rms_norm_fused(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the q latent qr [N, q_lora] and of the kv latent kv [N, kv_lora] in one compiled pass (fp32
    math, as vLLM's fused kernel), each into a new tensor in its input's dtype."""
    check_q_kv_norm(qr, kv, q_weight, kv_weight)
    if qr.shape[0] == 0:
        return torch.empty_like(qr, memory_format=torch.contiguous_format), torch.empty_like(
            kv, memory_format=torch.contiguous_format)
    args = (qr, kv, q_weight, kv_weight, eps)
    if qr.shape[0] == 1:
        return as_two_rows(dynamic(*Q_KV_NORM_PASS), args, (0, 1))
    return dynamic(*Q_KV_NORM_PASS)(*args)


def _kda_decode_slots_body(x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, gate,
                           norm_weight, out, lower_bound: float | None, scale: float, eps: float):
    live, idx, (conv_state, state) = pools.gather(slots, conv_pool, state_pool)
    y = stages.conv_silu(x, conv_state, conv_weight)
    o, new_state = stages.kda_recurrence(y, raw_g, raw_beta, A_log, dt_bias, state, lower_bound, scale)
    out.copy_(pools.zero_null(live, k3.gated_rms_norm(o, gate, norm_weight, eps)))
    return idx, pools.keep_null(live, stages.rolled(conv_state, x), conv_state), pools.keep_null(live, new_state, state)


KDA_DECODE_PASS = (_kda_decode_slots_body, pools.STEP_TOKEN_ARGS)


def _fused_step(*args) -> torch.Tensor:
    """The pass and the write-back of both states; `args` as `kda_decode_slots_fused`'s."""
    conv_pool, state_pool = args[1], args[7]
    idx, new_conv, new_state = dynamic(*KDA_DECODE_PASS)(*args)
    pools.store(idx, (conv_pool, state_pool), (new_conv, new_state))
    return args[pools.STEP_OUT]


def kda_decode_slots_fused(x: torch.Tensor, conv_pool: torch.Tensor, conv_weight: torch.Tensor, raw_g: torch.Tensor,
                           raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                           state_pool: torch.Tensor, slots: torch.Tensor, gate: torch.Tensor,
                           norm_weight: torch.Tensor, out: torch.Tensor, lower_bound: float | None, scale: float,
                           eps: float) -> torch.Tensor:
    """One KDA decode step for N sequences (one token each) in one compiled pass: conv update, recurrent update
    and sigmoid-gated RMSNorm, out [N, H, D] written directly; then the two new states stored to their slots.

    x [N, 3HD] (q|k|v before the conv); raw_g [N, H, D]; raw_beta [N, H] (logit); gate [N, H, D]; conv_pool
    [slots, 3HD, W-1] and state_pool [slots, H, dv, dk] updated in place at `slots` [N] (a slot <= 0 is null:
    `slots.py`). One sequence runs as two equal rows (`dynamic.as_two_rows`).
    """
    return pools.run_step(_fused_step, x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots,
                          gate, norm_weight, out, lower_bound, scale, eps)
