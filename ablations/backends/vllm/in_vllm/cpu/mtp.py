"""The K3 MTP head's input preparation (vllm/models/kimi_k3/common/mtp.py: a Triton kernel)."""

from __future__ import annotations

import torch

from opts.k3 import rms_norm_fp32


def fused_mtp_input(positions, inputs_embeds, previous_hidden_states, enorm_weight, hnorm_weight, eps):
    """[enorm(embedding, zeroed at position 0) | hnorm(previous hidden)] -> [T, 2H]."""
    embeds = inputs_embeds.masked_fill((positions == 0).view(-1, 1), 0)
    out = torch.cat(
        [rms_norm_fp32(embeds, enorm_weight, eps), rms_norm_fp32(previous_hidden_states, hnorm_weight, eps)], dim=-1
    )
    return out.to(inputs_embeds.dtype)
