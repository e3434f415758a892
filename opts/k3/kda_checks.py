"""Shape checks of the KDA references and kernels; every error names the argument and its shape."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KdaDims:
    """Sizes of one KDA call: batch, time, heads, key dim, value dim."""

    batch: int
    time: int
    heads: int
    dk: int
    dv: int


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """fp32, or fp64 when any input is fp64: the references run in at least fp32."""
    dtypes = [t.dtype for t in tensors if t is not None]
    return torch.float64 if torch.float64 in dtypes else torch.float32


def check_kda_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor) -> KdaDims:
    """q, k, g [B, T, H, dk]; v [B, T, H, dv]; beta [B, T, H]."""
    if q.dim() != 4:
        raise ValueError(f"q: expected [batch, time, heads, dk], got shape {tuple(q.shape)}")
    b, t, h, dk = q.shape
    for name, x in (("k", k), ("g", g)):
        if tuple(x.shape) != (b, t, h, dk):
            raise ValueError(f"{name}: expected shape {(b, t, h, dk)} like q, got {tuple(x.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (b, t, h):
        raise ValueError(f"v: expected [{b}, {t}, {h}, dv] like q, got shape {tuple(v.shape)}")
    if tuple(beta.shape) != (b, t, h):
        raise ValueError(f"beta: expected shape {(b, t, h)}, got {tuple(beta.shape)}")
    return KdaDims(b, t, h, dk, v.shape[-1])


def check_state(name: str, state: torch.Tensor | None, num_seqs: int, dims: KdaDims) -> None:
    """A state is [N, H, dk, dv]."""
    if state is None:
        return
    expected = (num_seqs, dims.heads, dims.dk, dims.dv)
    if tuple(state.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected} ([seqs, heads, dk, dv]), got {tuple(state.shape)}")


def check_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> list[int]:
    """The sequence boundaries as Python ints; starts at 0, non-decreasing, ends at `total`."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens: expected a 1-D tensor [N+1] with N >= 1, got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype.is_floating_point:
        raise ValueError(f"cu_seqlens: expected an integer tensor, got {cu_seqlens.dtype}")
    bounds = [int(x) for x in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != total or any(nxt < prev for prev, nxt in itertools.pairwise(bounds)):
        raise ValueError(f"cu_seqlens: must start at 0, never decrease and end at {total} (the token count), "
                         f"got {bounds}")
    return bounds
