"""moe_dedup's bench cases: off, on and sp timed on real ranks (not in-process `BenchCase`s), one case per
scope and token count; `runner.run_bench` runs them on one pool of processes.

Scopes: "tail", from the routed-expert and shared-expert partial outputs to the layer output (the part the modes
change), at K3's per-rank shapes; "layer", the whole MoE layer with the routed experts cut to `K3_MOE_BENCH`
(896 -> 16 experts, top-16 -> top-2: a token's expert FLOPs are 1/8 of K3's; hidden, latent, expert intermediate
and the shared experts stay K3's)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opts.moe_dedup.shape import K3_MOE, K3_MOE_BENCH, MoeShape

WORLD_SIZE = 2
MODES = ("off", "on", "sp")
QUICK_TOKENS = (1, 64, 1024)
FULL_TOKENS = (1, 64, 1024, 8192)
# on and sp against off: max |diff| <= CHECK_RTOL * max |off| (fp32 sums in other orders; routing is float64).
CHECK_RTOL = 1e-4


@dataclass(frozen=True)
class DistCase:
    """Off, on and sp (`modes`) on `world_size` ranks for a step of `num_tokens` tokens, timed over `rounds`
    interleaved rounds (off, on, sp, then sp, on, off, ...); the first round's outputs are checked against off's."""

    name: str
    scope: str
    shape: MoeShape
    num_tokens: int
    rounds: int
    world_size: int = WORLD_SIZE
    device: str = "cpu"
    seed: int = 0
    modes: tuple[str, ...] = MODES

    def __post_init__(self) -> None:
        if self.scope not in ("tail", "layer"):
            raise ValueError(f"DistCase.scope: invalid value {self.scope!r}; valid choices: tail, layer")
        for name in ("num_tokens", "rounds", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DistCase.{name}: invalid value {value!r}; valid: an integer >= 1")
        if self.modes[:1] != ("off",) or not set(self.modes) <= set(MODES) or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"DistCase.modes: invalid value {self.modes!r}; valid: off first, then any of on, sp")
        self.shape.check_world_size(self.world_size, split_hidden="on" in self.modes,
                                    expert_parallel="sp" in self.modes)

    @property
    def backend(self) -> str:
        """gloo on a CPU; nccl on GPUs, one per rank."""
        return "nccl" if self.device.startswith("cuda") else "gloo"


def _rounds(quick: bool, scope: str, num_tokens: int) -> int:
    """Rounds (the first one also the check): fewer where a call takes seconds, to keep the full set ~5 minutes."""
    if num_tokens <= 64:
        return 9 if quick or scope == "tail" else 7
    if num_tokens <= 1024:
        return 5 if quick else 7 if scope == "tail" else 3
    return 3 if scope == "tail" else 2


def bench_cases(quick: bool, device: str) -> list[DistCase]:
    """quick: the tail at 1, 64 and 1024 tokens; full: tail and layer at 1, 64, 1024 and 8192 tokens. Two ranks;
    on a GPU machine they need two GPUs (nccl), else they run on the CPU (gloo)."""
    if device.startswith("cuda") and torch.cuda.device_count() < WORLD_SIZE:
        device = "cpu"
    scopes = ("tail",) if quick else ("tail", "layer")
    tokens = QUICK_TOKENS if quick else FULL_TOKENS
    return [DistCase(f"{scope}_T{t}", scope, K3_MOE if scope == "tail" else K3_MOE_BENCH, t, _rounds(quick, scope, t),
                     device=device)
            for scope in scopes for t in tokens]
