"""Counterfactual off paths: unfused forms that stock vLLM never runs, measured beside the toggle, not in it.

`attn_res`: vLLM always runs its fused Triton `attn_res` kernel (vllm/models/kimi_k3/*/ops/attn_res.py);
there is no unfused path to switch to. The counterfactual is the natural split: the residual mix as one
compiled pass into a tensor, then the sub-layer's input RMSNorm as vLLM's RMSNorm, a second pass.
"""

from __future__ import annotations

import torch

from opts.fusion import stages
from opts.fusion.checks import check_attn_res
from opts.fusion.compiled import compiled
from opts.fusion.inputs import AttnResLayer, AttnResStep
from opts.fusion.naive import rms_norm


def _mix_body(prefix, delta, blocks, norm_weight, proj_weight, out, num_blocks: int, write_idx: int, eps: float):
    out.copy_(stages.attn_res_mix(prefix, delta, blocks, norm_weight, proj_weight, num_blocks, write_idx, eps))


def attn_res_unfused(layer: AttnResLayer, step: AttnResStep) -> torch.Tensor:
    """The attention residual as two passes: delta add, block store and softmax mix into a new tensor, then
    RMSNorm of it. Returns [T, hidden]; prefix and blocks are updated in place, as by `attn_res_fused`."""
    check_attn_res(layer, step)
    mixed = torch.empty_like(step.prefix)
    compiled(_mix_body)(step.prefix, step.delta, step.blocks, layer.res_norm_weight, layer.res_proj_weight, mixed,
                        step.num_blocks, step.block_write_idx, layer.eps)
    return rms_norm(mixed, layer.out_norm_weight, layer.out_eps)
