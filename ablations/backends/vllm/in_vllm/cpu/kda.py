"""KDA kernels of vLLM's K3 / Kimi-Linear layers, replaced by the project's PyTorch KDA.

Replaces the Triton-only `chunk_kda_with_fused_gate`, `fused_recurrent_kda` and
`fused_recurrent_kda_packed_decode` (vllm/models/kimi_k3/nvidia/ops/third_party/kda) with
vLLM's calling conventions kept:

- the recurrent state cache is [slots, H, dv, dk] fp32 (ours is [.., dk, dv]: transposed here);
- the gate arrives raw: g = lower_bound·σ(e^A·(raw+dt_bias)) with a lower bound, else
  −e^A·softplus(raw+dt_bias); β arrives as a logit;
- q and k are L2-normalised here (x / sqrt(Σx² + 1e-6), the kernels' rule);
- slot index ≤ 0 is the null block: no state is read or written and every output token of the
  row is zero (vLLM's kernels zero the row's first token and leave the rest as they were);
- speculative rows start from slot `state_indices[n, num_accepted[n]-1]` and write the state after
  token t into slot `state_indices[n, t]`; `num_accepted[n] <= 0` makes the row null (vLLM never
  passes it: its padding uses 1; its kernel would read the slot before the row).

Prefill and verification run kda_overlap's off code (`opts.kda_overlap.in_vllm.kernels`, over
`naive.step_off`): the verification rows through the batched recurrent form with the state after
every position, the prefill segments through the packed chunked form (chunks of 64). So the
stock cell of the `kda_overlap` toggle is the function its microbenchmark calls off, and its `on`
patches (opts/kda_overlap/vllm.py) wrap these two. Plain decode runs `opts.k3`'s recurrent KDA.
"""

from __future__ import annotations

import torch

from opts import k3
from opts.k3 import kda_gate as activate_gate
from opts.kda_overlap.in_vllm.kernels import chunk_kda_with_fused_gate, fused_recurrent_kda
from opts.vllm_setting import KDA_FORWARD

__all__ = ["MIXED_STEP_COUNTER", "activate_gate", "chunk_kda_with_fused_gate", "fused_recurrent_kda",
           "fused_recurrent_kda_packed_decode", "gather_initial_states", "observe_mixed_steps"]


def recurrent_states(q, k, v, g, beta, initial_state) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode: (o [B, 1, H, dv], the state after the token [B, 1, H, dk, dv])."""
    return k3.recurrent_kda_states(q, k, v, g, beta, initial_state=initial_state)


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return k3.l2_normalize(x.float())


def to_ours(state: torch.Tensor) -> torch.Tensor:
    """vLLM [.., dv, dk] -> ours [.., dk, dv] (fp32)."""
    return state.float().transpose(-1, -2)


def to_vllm(state: torch.Tensor) -> torch.Tensor:
    return state.transpose(-1, -2)


def fused_recurrent_kda_packed_decode(
    mixed_qkv: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float | None,
    initial_state: torch.Tensor,
    state_indices: torch.Tensor,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-token KDA decode for a batch of sequences from packed post-conv [q|k|v] rows."""
    _, H, V, K = initial_state.shape
    B = mixed_qkv.shape[0]
    if scale is not None and scale != K**-0.5:
        raise NotImplementedError(f"fused_recurrent_kda_packed_decode: only scale=dk**-0.5, got {scale}")
    if out is None:
        out = torch.empty((1, B, H, V), dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    q, k, v = mixed_qkv.split([H * K, H * K, H * V], dim=-1)
    live = (state_indices > 0).nonzero().flatten()
    out[0, (state_indices <= 0)] = 0
    if live.numel() == 0:
        return out, initial_state
    slots = state_indices[live].long()
    # Each live sequence becomes one batch row of length 1.
    qb = l2_normalize(q[live].view(-1, 1, H, K))
    kb = l2_normalize(k[live].view(-1, 1, H, K))
    vb = v[live].view(-1, 1, H, V).float()
    g = activate_gate(raw_g[0, live].view(-1, 1, H, K), A_log, dt_bias, lower_bound)
    beta = torch.sigmoid(raw_beta[0, live].float()).view(-1, 1, H)
    o, states = recurrent_states(qb, kb, vb, g, beta, to_ours(initial_state[slots]))
    out[0, live] = o[:, 0].to(out.dtype)
    initial_state[slots] = to_vllm(states[:, 0]).to(initial_state.dtype)
    return out, initial_state


def gather_initial_states(
    state: torch.Tensor, indices: torch.Tensor, has_initial_state: torch.Tensor
) -> torch.Tensor:
    """Dense copy of `state[indices]`, zero rows where `has_initial_state` is False; their index is
    not read (S3)."""
    rows = state[torch.where(has_initial_state, indices.long(), 0)]
    return torch.where(has_initial_state.view(-1, *([1] * (rows.ndim - 1))), rows, torch.zeros_like(rows))


MIXED_STEP_COUNTER = "kda_mixed_prefill_verify_calls"
K3_FORWARD = KDA_FORWARD


def observe_mixed_steps(self, *args, **kwargs):
    """K3 KDA layer forward, counting calls whose step holds prefill rows and speculative rows together
    (the steps `kda_overlap` acts on)."""
    from vllm.forward_context import get_forward_context

    from ablations.backends.vllm.in_vllm.counters import count
    from ablations.backends.vllm.in_vllm.patches import original

    metadata = get_forward_context().attn_metadata
    m = metadata.get(self.prefix) if isinstance(metadata, dict) else None
    if m is not None and m.num_spec_decodes > 0 and m.num_prefills > 0:
        count(MIXED_STEP_COUNTER)
    return original(K3_FORWARD)(self, *args, **kwargs)
