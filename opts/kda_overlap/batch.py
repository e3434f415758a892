"""The mixed engine step that kda_overlap computes, and its outputs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields, replace

import torch

STATE_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class MixedStep:
    """One step of KDA work: prefill segments, then speculative-verification rows, tokens packed along dim 0.

    q, k, g [T, H, dk]; v [T, H, dv]; beta [T, H]. Tokens are ordered: every prefill segment (lengths
    `prefill_lens`, each >= 1), then every verification row (`verify_lens`: K+1 tokens each, 0 allowed: a
    row with nothing to verify this step). `prefill_state` [P, H, dk, dv] and `verify_state` [R, H, dk, dv]
    are the states each sequence continues (fp32, or fp64 for references).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    prefill_lens: tuple[int, ...]
    verify_lens: tuple[int, ...]
    prefill_state: torch.Tensor
    verify_state: torch.Tensor
    scale: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefill_lens", tuple(int(x) for x in self.prefill_lens))
        object.__setattr__(self, "verify_lens", tuple(int(x) for x in self.verify_lens))
        if self.q.dim() != 3:
            raise ValueError(f"MixedStep.q: expected [tokens, heads, dk], got shape {tuple(self.q.shape)}")
        t, h, dk = self.q.shape
        for name in ("k", "g"):
            x = getattr(self, name)
            if tuple(x.shape) != (t, h, dk):
                raise ValueError(f"MixedStep.{name}: expected shape {(t, h, dk)} like q, got {tuple(x.shape)}")
        if self.v.dim() != 3 or tuple(self.v.shape[:2]) != (t, h):
            raise ValueError(f"MixedStep.v: expected [{t}, {h}, dv], got shape {tuple(self.v.shape)}")
        if tuple(self.beta.shape) != (t, h):
            raise ValueError(f"MixedStep.beta: expected shape {(t, h)}, got {tuple(self.beta.shape)}")
        for name in ("q", "k", "v", "g", "beta"):
            x = getattr(self, name)
            if not x.dtype.is_floating_point or x.device != self.q.device:
                raise ValueError(f"MixedStep.{name}: expected a floating tensor on {self.q.device}, "
                                 f"got {x.dtype} on {x.device}")
        if any(n < 1 for n in self.prefill_lens):
            raise ValueError(f"MixedStep.prefill_lens: every segment needs >= 1 token, got {self.prefill_lens}")
        if any(n < 0 for n in self.verify_lens):
            raise ValueError(f"MixedStep.verify_lens: lengths must be >= 0, got {self.verify_lens}")
        total = sum(self.prefill_lens) + sum(self.verify_lens)
        if total != t:
            raise ValueError(f"MixedStep.prefill_lens + verify_lens: sum to {total} tokens but q holds {t}")
        dv = self.v.shape[-1]
        for name, count in (("prefill_state", len(self.prefill_lens)), ("verify_state", len(self.verify_lens))):
            x = getattr(self, name)
            if tuple(x.shape) != (count, h, dk, dv):
                raise ValueError(f"MixedStep.{name}: expected shape {(count, h, dk, dv)} "
                                 f"([seqs, heads, dk, dv]), got {tuple(x.shape)}")
            if x.dtype not in STATE_DTYPES or x.device != self.q.device:
                raise ValueError(f"MixedStep.{name}: expected float32 or float64 on {self.q.device}, "
                                 f"got {x.dtype} on {x.device}")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"MixedStep.scale: must be > 0 or None (dk**-0.5), got {self.scale}")

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def dk(self) -> int:
        return self.q.shape[2]

    @property
    def dv(self) -> int:
        return self.v.shape[2]

    @property
    def num_prefill(self) -> int:
        return len(self.prefill_lens)

    @property
    def num_verify(self) -> int:
        return len(self.verify_lens)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(self.prefill_lens)

    @property
    def num_verify_tokens(self) -> int:
        return sum(self.verify_lens)

    @property
    def resolved_scale(self) -> float:
        return self.dk ** -0.5 if self.scale is None else self.scale

    @property
    def seq_lens(self) -> tuple[int, ...]:
        """Prefill segments then verification rows, the packed order."""
        return self.prefill_lens + self.verify_lens

    @property
    def token_bounds(self) -> list[int]:
        """Start offset of each sequence in packed order, plus the total: [N+1]."""
        return [0, *itertools.accumulate(self.seq_lens)]

    @property
    def verify_bounds(self) -> list[int]:
        """Start offset of each verification row in `StepOutput.verify_states`, plus the total: [R+1]."""
        return [0, *itertools.accumulate(self.verify_lens)]

    def token_slices(self, sl: slice) -> tuple[torch.Tensor, ...]:
        """(q, k, v, g, beta) of the tokens in `sl`, with a leading batch dim of 1."""
        return tuple(x[sl].unsqueeze(0) for x in (self.q, self.k, self.v, self.g, self.beta))

    def to(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None,
           state_dtype: torch.dtype | None = None) -> MixedStep:
        """A copy with the token tensors in `dtype` and the states in `state_dtype` (default: unchanged)."""
        def cast(x: torch.Tensor, dt: torch.dtype | None) -> torch.Tensor:
            return x.to(device=device or x.device, dtype=dt or x.dtype)

        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("q", "k", "v", "g", "beta"):
            values[name] = cast(values[name], dtype)
        for name in ("prefill_state", "verify_state"):
            values[name] = cast(values[name], state_dtype)
        return replace(self, **values)


@dataclass(frozen=True)
class StepOutput:
    """o [T, H, dv] in the tokens' dtype; prefill_final_state [P, H, dk, dv] and verify_states [T_v, H, dk, dv]
    (the state after every verification position, rows in order) in the state dtype."""

    o: torch.Tensor
    prefill_final_state: torch.Tensor
    verify_states: torch.Tensor

    @classmethod
    def empty(cls, batch: MixedStep, *, dtype: torch.dtype | None = None, state_dtype: torch.dtype | None = None,
              fill: float | None = None) -> StepOutput:
        """Buffers shaped for `batch`; `fill=float('nan')` poisons them so unwritten entries show."""
        dtype = dtype or batch.q.dtype
        state_dtype = state_dtype or batch.verify_state.dtype
        shapes = cls.shapes(batch)
        dev = batch.q.device
        out = cls(torch.empty(shapes["o"], dtype=dtype, device=dev),
                  torch.empty(shapes["prefill_final_state"], dtype=state_dtype, device=dev),
                  torch.empty(shapes["verify_states"], dtype=state_dtype, device=dev))
        if fill is not None:
            for x in (out.o, out.prefill_final_state, out.verify_states):
                x.fill_(fill)
        return out

    @staticmethod
    def shapes(batch: MixedStep) -> dict[str, tuple[int, ...]]:
        """The shape of each field for `batch`."""
        h, dk, dv = batch.num_heads, batch.dk, batch.dv
        return {"o": (batch.q.shape[0], h, dv), "prefill_final_state": (batch.num_prefill, h, dk, dv),
                "verify_states": (batch.num_verify_tokens, h, dk, dv)}

    def check_fits(self, batch: MixedStep) -> None:
        """An out= buffer must have exactly the shapes of `StepOutput.empty(batch)`, contiguous, on its device."""
        for name, want in self.shapes(batch).items():
            got = getattr(self, name)
            if tuple(got.shape) != want or not got.is_contiguous() or got.device != batch.q.device:
                raise ValueError(f"out.{name}: expected a contiguous tensor of shape {want} on {batch.q.device}, "
                                 f"got shape {tuple(got.shape)} on {got.device} "
                                 f"(contiguous: {got.is_contiguous()})")
