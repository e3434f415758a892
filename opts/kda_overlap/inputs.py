"""Random KDA inputs with K3-like statistics, for tests and benchmarks (seeded, reproducible)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from opts.kda_overlap.batch import MixedStep


@dataclass(frozen=True)
class StepShape:
    """A mixed step's shape: prefill segment lengths, verification row lengths (K+1, or 0), head sizes."""

    prefill_lens: tuple[int, ...]
    verify_lens: tuple[int, ...]
    num_heads: int = 12
    dk: int = 128
    dv: int = 128

    def __post_init__(self) -> None:
        for name in ("num_heads", "dk", "dv"):
            if getattr(self, name) < 1:
                raise ValueError(f"StepShape.{name}: must be >= 1, got {getattr(self, name)}")

    @property
    def num_tokens(self) -> int:
        return sum(self.prefill_lens) + sum(self.verify_lens)


def random_kda_tensors(shape: Sequence[int], num_heads: int, dk: int, dv: int, *, dtype: torch.dtype,
                       generator: torch.Generator, decay: float = 1.0,
                       device: str | torch.device = "cpu") -> tuple[torch.Tensor, ...]:
    """(q, k, v, g, beta) of shape [*shape, H, D]: q, k unit-norm per head, g = decay·logsigmoid(N(2, 1))
    (mostly slow decay, a few fast channels), beta = sigmoid(N(0, 1)). `decay` scales the log decay."""
    lead = tuple(shape)

    def normal(*s: int) -> torch.Tensor:
        return torch.randn(*lead, *s, generator=generator, dtype=torch.float64)

    q = F.normalize(normal(num_heads, dk), dim=-1)
    k = F.normalize(normal(num_heads, dk), dim=-1)
    v = normal(num_heads, dv)
    g = decay * F.logsigmoid(normal(num_heads, dk) + 2.0)
    beta = torch.sigmoid(normal(num_heads))
    return tuple(x.to(dtype=dtype, device=device) for x in (q, k, v, g, beta))


def random_state(num_seqs: int, num_heads: int, dk: int, dv: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> torch.Tensor:
    """A non-zero recurrent state [N, H, dk, dv] of the size a running request carries."""
    s = torch.randn(num_seqs, num_heads, dk, dv, generator=generator, dtype=torch.float64) * 0.5
    return s.to(dtype=dtype, device=device)


def random_step(shape: StepShape, *, dtype: torch.dtype = torch.float32, seed: int = 0, decay: float = 1.0,
                device: str | torch.device = "cpu", state_dtype: torch.dtype = torch.float32) -> MixedStep:
    """A mixed step with random tokens and non-zero initial states for every sequence."""
    gen = torch.Generator().manual_seed(seed)
    h, dk, dv = shape.num_heads, shape.dk, shape.dv
    q, k, v, g, beta = random_kda_tensors((shape.num_tokens,), h, dk, dv, dtype=dtype, generator=gen,
                                          decay=decay, device=device)
    prefill_state = random_state(len(shape.prefill_lens), h, dk, dv, generator=gen, dtype=state_dtype,
                                 device=device)
    verify_state = random_state(len(shape.verify_lens), h, dk, dv, generator=gen, dtype=state_dtype,
                                device=device)
    return MixedStep(q, k, v, g, beta, shape.prefill_lens, shape.verify_lens, prefill_state, verify_state)
