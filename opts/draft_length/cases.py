"""draft_length's bench cases: goodput, not off/on times. Each case times real steps of the CPU stack over a
(batch, K) grid (`bench/step_times.py`) and scores fixed and chosen K on held-out repeats (`bench/evaluate.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from opts.draft_length.acceptance import check_k
from opts.draft_length.bench.stack import StackShape
from opts.draft_length.bench.step_times import check_clock, check_grid
from opts.draft_length.config import PROFILES
from opts.draft_length.cost import check_batch

FULL_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
FULL_KS = tuple(range(9))
FULL_REPEATS = 10
QUICK_BATCHES = (1, 2, 4, 8, 16)
QUICK_KS = (0, 1, 2, 3, 4, 6)
QUICK_REPEATS = 6
FIXED_K = 3


@dataclass(frozen=True)
class GoodputCase:
    """One measured grid: `repeats` steps per (batch, K) of `shape`'s stack on `threads` torch threads timed by
    `clock` (`bench/step_times.py`), scored for `profiles` against `fixed_k`."""

    name: str
    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    repeats: int
    shape: StackShape = field(default_factory=StackShape)
    threads: int = 1
    clock: str = "cpu"
    fixed_k: int = FIXED_K
    profiles: tuple[str, ...] = PROFILES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"GoodputCase.name: invalid value {self.name!r}; valid: a non-empty string")
        object.__setattr__(self, "batch_sizes", check_grid("GoodputCase.batch_sizes", self.batch_sizes, check_batch))
        object.__setattr__(self, "ks", check_grid("GoodputCase.ks", self.ks, check_k))
        check_batch(self.threads, "GoodputCase.threads")
        check_clock(self.clock, self.threads)
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 2:
            raise ValueError(f"GoodputCase.repeats: invalid value {self.repeats!r}; valid: an integer >= 2")
        if self.fixed_k not in self.ks:
            raise ValueError(f"GoodputCase.fixed_k: invalid value {self.fixed_k!r}; valid: one of ks {list(self.ks)}")
        bad = [p for p in self.profiles if p not in PROFILES]
        if bad or not self.profiles:
            raise ValueError(f"GoodputCase.profiles: invalid value {list(self.profiles)!r}; valid: some of "
                             f"{', '.join(PROFILES)}")


def bench_cases(quick: bool, device: str) -> list[GoodputCase]:
    """The CPU stack's grid: batch sizes 1..32 (powers of two and midway) x K 0..8 x 10 repeats, or (quick) 1..16 x
    K {0, 1, 2, 3, 4, 6} x 6 repeats. The stack runs on the CPU whatever `device` is."""
    if quick:
        return [GoodputCase("quick_cpu_stack", QUICK_BATCHES, QUICK_KS, QUICK_REPEATS)]
    return [GoodputCase("cpu_stack", FULL_BATCHES, FULL_KS, FULL_REPEATS)]
