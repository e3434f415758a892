"""The fused passes in vLLM's calling conventions: what `vllm.py`'s patches run inside an engine when on.

The math is `stages.py`'s and `opts.k3`'s, as in `fused.py`; what differs is the calling convention:
- `q_kv_rms_norm_fused` has the signature of vLLM's `fused_q_kv_rmsnorm` (models/common/ops/fused_qk_rmsnorm.py):
  the q and kv latents as two views, two new output tensors;
- `kda_decode_slots_fused` reads the conv and recurrent states from vLLM's slot pools through the step's slot
  indices, as vLLM's fused decode kernels do (`ops.fused_kda_decode`, nvidia/kda.py:1012-1028), and writes
  them back there. The pass returns the new states and a scatter stores them: vLLM's two pools are views of
  one cache storage with different bases, which a compiled graph cannot mutate as two inputs
  (aot_autograd: "non-differentiable view input mutations"); inductor would stage the new states in a
  buffer before scattering them in any case, since it cannot prove the slots distinct.
Both are `dynamic.py` passes: the token count varies from step to step without a graph per count.
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import stages
from opts.fusion.dynamic import dynamic


def _expect(name: str, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape} ({what}), got {tuple(x.shape)}")


def _q_kv_norm_body(qr, kv, q_weight, kv_weight, eps: float):
    return k3.rms_norm_fp32(qr, q_weight, eps).to(qr.dtype), k3.rms_norm_fp32(kv, kv_weight, eps).to(kv.dtype)


def q_kv_rms_norm_fused(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of the q latent qr [N, q_lora] and of the kv latent kv [N, kv_lora] in one compiled pass (fp32
    math, as vLLM's fused kernel), each into a new tensor in its input's dtype."""
    if qr.dim() != 2 or kv.dim() != 2 or qr.shape[0] != kv.shape[0]:
        raise ValueError(f"qr, kv: expected [tokens, q_lora] and [tokens, kv_lora], got {tuple(qr.shape)} and "
                         f"{tuple(kv.shape)}")
    _expect("q_weight", q_weight, (qr.shape[1],), "q_lora")
    _expect("kv_weight", kv_weight, (kv.shape[1],), "kv_lora")
    if qr.shape[0] == 0:
        return torch.empty_like(qr, memory_format=torch.contiguous_format), torch.empty_like(
            kv, memory_format=torch.contiguous_format)
    return dynamic(_q_kv_norm_body, (0, 1))(qr, kv, q_weight, kv_weight, eps)


def _kda_decode_slots_body(x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, gate,
                           norm_weight, out, lower_bound: float | None, scale: float, eps: float):
    live = slots > 0
    idx = torch.where(live, slots, 0).long()       # a null row reads the null slot 0 and gets it back unchanged
    conv_state, state = conv_pool[idx], state_pool[idx]
    y = stages.conv_silu(x, conv_state, conv_weight)
    o, new_state = stages.kda_recurrence(y, raw_g, raw_beta, A_log, dt_bias, state, lower_bound, scale)
    rows = live[:, None, None]
    out.copy_(torch.where(rows, k3.gated_rms_norm(o, gate, norm_weight, eps), 0.0))
    new_conv = torch.where(rows, stages.rolled(conv_state, x).to(conv_pool.dtype), conv_state)
    return idx, new_conv, torch.where(rows.unsqueeze(-1), new_state.to(state_pool.dtype), state)


# x, raw_g, raw_beta, slots, gate, out: one row per sequence
TOKEN_ARGS = (0, 3, 4, 8, 9, 11)


def check_kda_decode_slots(x, conv_pool, conv_weight, raw_g, raw_beta, state_pool, slots, gate, out) -> None:
    """Shapes of one engine decode step; every error names the argument."""
    n = x.shape[0]
    heads, dim = raw_g.shape[1:] if raw_g.dim() == 3 else (None, None)
    if heads is None or x.dim() != 2 or x.shape[1] != 3 * heads * dim:
        raise ValueError(f"x, raw_g: expected [tokens, 3*H*D] and [tokens, H, D], got {tuple(x.shape)} and "
                         f"{tuple(raw_g.shape)}")
    width = conv_weight.shape[-1]
    _expect("conv_weight", conv_weight, (3 * heads * dim, width), "channels, conv width")
    _expect("conv_pool", conv_pool, (conv_pool.shape[0], 3 * heads * dim, width - 1), "slots, channels, width - 1")
    _expect("state_pool", state_pool, (state_pool.shape[0], heads, dim, dim), "slots, heads, dv, dk")
    _expect("raw_g", raw_g, (n, heads, dim), "tokens, heads, head_dim")
    _expect("raw_beta", raw_beta, (n, heads), "tokens, heads")
    _expect("slots", slots, (n,), "tokens")
    _expect("gate", gate, (n, heads, dim), "tokens, heads, head_dim")
    _expect("out", out, (n, heads, dim), "tokens, heads, head_dim")
    if slots.dtype.is_floating_point:
        raise ValueError(f"slots: expected an integer tensor, got {slots.dtype}")


def kda_decode_slots_fused(x: torch.Tensor, conv_pool: torch.Tensor, conv_weight: torch.Tensor, raw_g: torch.Tensor,
                           raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                           state_pool: torch.Tensor, slots: torch.Tensor, gate: torch.Tensor,
                           norm_weight: torch.Tensor, out: torch.Tensor, lower_bound: float | None, scale: float,
                           eps: float) -> torch.Tensor:
    """One KDA decode step for N sequences (one token each) in one compiled pass: conv update, recurrent update
    and sigmoid-gated RMSNorm, out [N, H, D] written directly; then the two new states scattered to their slots.

    x [N, 3HD] (q|k|v before the conv); raw_g [N, H, D]; raw_beta [N, H] (logit); gate [N, H, D]; conv_pool
    [slots, 3HD, W-1] and state_pool [slots, H, dv, dk] updated in place at `slots` [N]. A slot <= 0 is vLLM's
    null block: its row's output is 0 and no live slot changes, as vLLM-CPU's kernels treat it (the null slot
    0 is read and written back as it was).
    """
    check_kda_decode_slots(x, conv_pool, conv_weight, raw_g, raw_beta, state_pool, slots, gate, out)
    if x.shape[0]:
        idx, new_conv, new_state = dynamic(_kda_decode_slots_body, TOKEN_ARGS)(
            x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots, gate, norm_weight, out,
            lower_bound, scale, eps)
        conv_pool[idx] = new_conv
        state_pool[idx] = new_state
    return out
