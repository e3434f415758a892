"""The on paths: each mechanism as one inductor-compiled pass over its stages (`stages.py`) that reads each
input once and writes each output once, into `out=` buffers and states in place, with no tensor between stages.

The bodies are plain torch; `compiled` turns each into fused kernels (C++ loops on CPU, Triton on GPU).
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import stages
from opts.fusion.checks import check_attn_res, check_kda_decode, check_mla_norm
from opts.fusion.compiled import compiled
from opts.fusion.inputs import AttnResLayer, AttnResStep, KdaDecodeLayer, KdaDecodeStep, MlaNormLayer


def _mla_norm_body(qkv, q_weight, kv_weight, q_out, kv_out, q_rank: int, kv_rank: int, eps: float):
    q_out.copy_(k3.rms_norm_fp32(qkv[:, :q_rank], q_weight, eps))
    kv_out.copy_(k3.rms_norm_fp32(qkv[:, q_rank:q_rank + kv_rank], kv_weight, eps))


def mla_norm_fused(layer: MlaNormLayer, qkv_lora: torch.Tensor, q_out: torch.Tensor | None = None,
                   kv_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both RMSNorms in one pass over the q_a/kv_a projection output, into q_out and kv_out.

    Returns (q normed [N, q_lora], kv normed [N, kv_lora], k_pe view [N, rope]); the rope part is not read.
    """
    check_mla_norm(layer, qkv_lora, q_out, kv_out)
    n, q_rank, kv_rank = qkv_lora.shape[0], layer.q_lora_rank, layer.kv_lora_rank
    kw = {"dtype": qkv_lora.dtype, "device": qkv_lora.device}
    q_out = torch.empty(n, q_rank, **kw) if q_out is None else q_out
    kv_out = torch.empty(n, kv_rank, **kw) if kv_out is None else kv_out
    compiled(_mla_norm_body)(qkv_lora, layer.q_weight, layer.kv_weight, q_out, kv_out, q_rank, kv_rank, layer.eps)
    return q_out, kv_out, qkv_lora[:, q_rank + kv_rank:]


def _kda_decode_body(x, conv_state, conv_weight, raw_g, raw_beta, A_log, dt_bias, state, gate, norm_weight, out,
                     lower_bound: float | None, scale: float, eps: float):
    y = stages.conv_silu(x, conv_state, conv_weight)
    conv_state.copy_(stages.rolled(conv_state, x))
    o, new_state = stages.kda_recurrence(y, raw_g, raw_beta, A_log, dt_bias, state, lower_bound, scale)
    state.copy_(new_state)
    out.copy_(k3.gated_rms_norm(o, gate, norm_weight, eps))


def kda_decode_fused(layer: KdaDecodeLayer, step: KdaDecodeStep, out: torch.Tensor) -> torch.Tensor:
    """Conv update, recurrent update and gated RMSNorm in one pass; out [N, H, D] written directly,
    conv_state and state updated in place, each state row read once."""
    check_kda_decode(layer, step, out)
    compiled(_kda_decode_body)(step.mixed_qkv, step.conv_state, layer.conv_weight, step.raw_g, step.raw_beta,
                               layer.A_log, layer.dt_bias, step.state, step.output_gate, layer.norm_weight, out,
                               layer.lower_bound, layer.qk_scale, layer.norm_eps)
    return out


def _attn_res_body(prefix, delta, blocks, norm_weight, proj_weight, out_weight, out,
                   num_blocks: int, write_idx: int, eps: float, out_eps: float):
    mixed = stages.attn_res_mix(prefix, delta, blocks, norm_weight, proj_weight, num_blocks, write_idx, eps)
    out.copy_(k3.rms_norm_fp32(mixed, out_weight, out_eps))


def attn_res_fused(layer: AttnResLayer, step: AttnResStep, out: torch.Tensor | None = None) -> torch.Tensor:
    """The attention-residual step in one pass: delta add, block store, softmax mix and output RMSNorm.

    Returns out [T, hidden]; prefix and blocks are updated in place. This is what vLLM always runs (its Triton
    `attn_res` kernel); the unfused form exists only as a counterfactual (`counterfactual.py`).
    """
    check_attn_res(layer, step, out)
    out = torch.empty_like(step.prefix) if out is None else out
    compiled(_attn_res_body)(step.prefix, step.delta, step.blocks, layer.res_norm_weight, layer.res_proj_weight,
                             layer.out_norm_weight, out, step.num_blocks, step.block_write_idx, layer.eps,
                             layer.out_eps)
    return out
