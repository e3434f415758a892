"""K3's KDA forget gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kda_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None,
             lower_bound: float | None) -> torch.Tensor:
    """K3's per-channel log decay from the raw gate [..., H, D]: the safe gate lower_bound*sigmoid(e^A (x + b)),
    or -e^A softplus(x + b) without a lower bound (b = 0 when dt_bias is None). fp32."""
    heads, dim = raw_g.shape[-2:]
    x = raw_g.float() if dt_bias is None else raw_g.float() + dt_bias.float().view(heads, dim)
    a = A_log.float().exp().unsqueeze(-1)
    if lower_bound is None:
        return -a * F.softplus(x)
    return lower_bound * torch.sigmoid(a * x)
