"""The off paths: the stages vLLM runs when the mechanism is not fused, each its own pass.

Each stage is one inductor-compiled pass (`compiled.py`) over its math in `stages.py`, at the compilation
level of the fused pass, or vLLM-CPU's own kernel where it has one (the conv update, `vllm_kernels.py`).
Between stages lie the tensors vLLM allocates and the copies it makes (vllm/models/kimi_k3/nvidia/kda.py:
`packed_conv_out`, the recurrent output, `core_attn_out[...] = o`, `core_attn_out.copy_(o_norm(...))`).

Inside vLLM-CPU off is stock vLLM with the project's CPU fixes, run eagerly as vLLM-CPU runs K3: the q/kv norms
are `q_kv_rms_norm` (the S15 fix calls it); the KDA stages are the S8 conv, the S4 recurrence and vLLM's own
`o_norm`, the same math as the stages here (README.md, "The toggle inside vLLM").
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import stages, vllm_kernels
from opts.fusion.checks import check_kda_decode, check_mla_norm
from opts.fusion.compiled import compiled
from opts.fusion.inputs import KdaDecodeLayer, KdaDecodeStep, MlaNormLayer

__all__ = ["CONV_BACKENDS", "causal_conv_update", "conv_backend", "gated_rms_norm", "kda_decode_unfused",
           "kda_recurrent_decode", "mla_norm_unfused", "q_kv_rms_norm", "rms_norm"]

CONV_BACKENDS = ("vllm", "inductor")


def _rms_norm_body(x, weight, out, eps: float):
    out.copy_(k3.rms_norm_native(x, weight, eps))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """vLLM's RMSNorm over the last dim as one compiled pass into a new tensor."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    compiled(_rms_norm_body)(x, weight, out, eps)
    return out


def mla_norm_unfused(layer: MlaNormLayer, qkv_lora: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the q_a/kv_a projection output and normalise q and kv with two separate RMSNorm passes.

    Returns (q normed [N, q_lora], kv normed [N, kv_lora], k_pe view [N, rope]).
    """
    check_mla_norm(layer, qkv_lora)
    q_c, kv_c, k_pe = qkv_lora.split([layer.q_lora_rank, layer.kv_lora_rank, layer.rope_dim], dim=-1)
    return rms_norm(q_c, layer.q_weight, layer.eps), rms_norm(kv_c, layer.kv_weight, layer.eps), k_pe


def q_kv_rms_norm(qr: torch.Tensor, kv: torch.Tensor, q_weight: torch.Tensor, kv_weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Off inside vLLM-CPU (the S15 CPU fix runs it in place of the Triton `fused_q_kv_rmsnorm`): the q and kv
    RMSNorms as two separate passes, each into a new tensor, with vLLM's RMSNorm math (`ir.ops.rms_norm`, whose
    only CPU implementation is these native ops), run op by op as vLLM-CPU runs K3's layers.

    The same math as `mla_norm_unfused`, which compiles each norm into one pass for the microbenchmark.
    """
    return k3.rms_norm_native(qr, q_weight, eps), k3.rms_norm_native(kv, kv_weight, eps)


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


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate) as one compiled pass into a new tensor in x's dtype."""
    out = torch.empty_like(x)
    compiled(_gated_norm_body)(x, gate, weight, out, eps)
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
