"""The attention residual as one inductor-compiled pass over its stages (`stages.py`): what vLLM always runs
(its Triton `attn_res` kernel), beside the counterfactual unfused form (`counterfactual.py`). Compiled for the
exact shapes (`compiled.py`). The toggled mechanisms' fused passes are in `passes.py`.
"""

from __future__ import annotations

import torch

from opts import k3
from opts.fusion import stages
from opts.fusion.checks import check_attn_res
from opts.fusion.compiled import compiled
from opts.fusion.inputs import AttnResLayer, AttnResStep


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
