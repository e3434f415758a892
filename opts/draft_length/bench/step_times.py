"""Times real steps of the tiny K3-like stack (`stack.py`) on this CPU: a verify pass of width K+1 over b sequences,
then K draft passes of the MTP head over b tokens, for every (b, K) of a grid. Each repeat runs every cell once in
a fresh seeded random order (so load on a shared machine hits all cells alike) after one untimed warm-up round.

Clock: "cpu" (the default) is this process's CPU time on one torch thread, which time spent preempted by other jobs
on a shared machine does not inflate (their memory traffic still can); "wall" is elapsed time, for several threads."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from opts.draft_length.acceptance import check_k
from opts.draft_length.bench.stack import Stack, StackCache, StackShape
from opts.draft_length.cost import check_batch


@dataclass(frozen=True)
class Sample:
    """One timed step: `verify_s` for the target's pass, `draft_s` for the K MTP passes."""

    batch: int
    k: int
    repeat: int
    verify_s: float
    draft_s: float

    @property
    def step_s(self) -> float:
        return self.verify_s + self.draft_s


def check_grid(name: str, values: Sequence[int], check) -> tuple[int, ...]:
    """`values` checked one by one with `check(value, name)`, distinct, sorted; else a ValueError naming `name`."""
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"{name}: invalid value {values!r}; valid: a non-empty list of integers")
    out = tuple(check(v, f"{name}[]") for v in values)
    if len(set(out)) != len(out):
        raise ValueError(f"{name}: invalid value {list(values)!r}; valid: no value twice")
    return tuple(sorted(out))


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def check_clock(clock: str, threads: int) -> str:
    """`clock` if known and usable on `threads` threads (CPU time needs one), else a ValueError naming it."""
    if clock not in CLOCKS:
        raise ValueError(f"clock: invalid value {clock!r}; valid: {', '.join(CLOCKS)}")
    if clock == "cpu" and threads != 1:
        raise ValueError(f"clock: invalid value 'cpu' with threads = {threads!r}; valid: 'wall', or 'cpu' with "
                         "threads = 1 (CPU time sums over threads)")
    return clock


@dataclass(frozen=True)
class Measurements:
    """Every sample of a grid: `repeats` steps per (batch, K), on `threads` torch threads, timed by `clock`."""

    shape: StackShape
    batch_sizes: tuple[int, ...]
    ks: tuple[int, ...]
    repeats: int
    threads: int
    samples: tuple[Sample, ...] = field(repr=False)
    clock: str = "cpu"

    def __post_init__(self) -> None:
        check_clock(self.clock, self.threads)
        object.__setattr__(self, "batch_sizes", check_grid("batch_sizes", self.batch_sizes, check_batch))
        object.__setattr__(self, "ks", check_grid("ks", self.ks, check_k))
        expected = {(b, k, r) for b in self.batch_sizes for k in self.ks for r in range(self.repeats)}
        if {(s.batch, s.k, s.repeat) for s in self.samples} != expected or len(self.samples) != len(expected):
            raise ValueError(f"Measurements.samples: {len(self.samples)} samples; valid: one per (batch, K, repeat) "
                             f"of {len(self.batch_sizes)} x {len(self.ks)} x {self.repeats}")

    def seconds(self, batch: int, k: int, repeats: Sequence[int] | None = None) -> list[float]:
        """Step seconds of one cell, over `repeats` (default all), in repeat order."""
        keep = set(range(self.repeats)) if repeats is None else set(repeats)
        return [s.step_s for s in sorted(self.samples, key=lambda s: s.repeat)
                if s.batch == batch and s.k == k and s.repeat in keep]

    def median(self, batch: int, k: int, repeats: Sequence[int] | None = None) -> float:
        """Median step seconds of one cell over `repeats` (default all)."""
        return statistics.median(self.seconds(batch, k, repeats))

    def to_dict(self) -> dict:
        return {"stack": {"spec": asdict(self.shape.spec), "vocab": self.shape.vocab, "context": self.shape.context},
                "batch_sizes": list(self.batch_sizes), "ks": list(self.ks), "repeats": self.repeats,
                "threads": self.threads, "clock": self.clock, "samples": [asdict(s) for s in self.samples]}


def time_step(stack: Stack, cache: StackCache, k: int, generator: torch.Generator,
              clock: Callable[[], float] = time.process_time) -> tuple[float, float]:
    """One step of `cache.batch` sequences with `k` drafts: (verify seconds, draft seconds) by `clock`."""
    tokens = torch.randint(0, stack.shape.vocab, (cache.batch, k + 1), generator=generator)
    start = clock()
    target, hidden = stack.verify(cache, tokens)
    middle = clock()
    stack.draft(cache, target[:, -1], hidden[:, -1], k)
    return middle - start, clock() - middle


def measure(batch_sizes: Sequence[int], ks: Sequence[int], repeats: int, *, shape: StackShape | None = None,
            threads: int = 1, clock: str = "cpu", seed: int = 0,
            progress: Callable[[str], None] | None = None) -> Measurements:
    """Time every (batch, K) `repeats` times, interleaved; torch runs on `threads` threads meanwhile."""
    batch_sizes, ks = check_grid("batch_sizes", batch_sizes, check_batch), check_grid("ks", ks, check_k)
    check_batch(repeats, "repeats")
    check_batch(threads, "threads")
    timer = CLOCKS[check_clock(clock, threads)]
    shape = StackShape() if shape is None else shape
    cells = [(b, k) for b in batch_sizes for k in ks]
    order, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    samples = []
    try:
        with torch.inference_mode():
            stack = Stack.random(shape, seed)
            caches = {b: stack.new_cache(b, max(ks) + 1, seed) for b in batch_sizes}
            for b, k in cells:
                time_step(stack, caches[b], k, generator)
            for repeat in range(repeats):
                start = time.perf_counter()
                for b, k in order.sample(cells, len(cells)):
                    samples.append(Sample(b, k, repeat, *time_step(stack, caches[b], k, generator, timer)))
                if progress:
                    seconds = time.perf_counter() - start
                    progress(f"repeat {repeat + 1}/{repeats}: {len(cells)} steps in {seconds:.1f} s")
    finally:
        torch.set_num_threads(before)
    return Measurements(shape, batch_sizes, ks, repeats, threads, tuple(samples), clock)
