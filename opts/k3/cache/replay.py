"""Replaying a stream through the hybrid pool at a fixed time per request (arrival to finish, as the trace says):
admissions at arrival, waits for blocks, frees at finish; one `CacheStats` per replay."""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.pool import HybridPool
from opts.k3.cache.resume import Resume
from opts.k3.cache.stream import CacheStream, stream_keys


class CapacityError(ValueError):
    """A request that cannot fit in the pool even when it is empty."""


@dataclass
class CacheStats:
    """One replay's result. `hits[i]`: prompt tokens request i found cached (vLLM's num_cached_tokens)."""

    num_blocks: int
    hits: list[int]
    prompt_tokens: list[int]
    num_evictions: int = 0
    num_resumes: int = 0
    checkpoint_bytes: int = 0
    num_waits: int = 0
    wait_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def hit_tokens(self) -> int:
        return sum(self.hits)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from cache / prompt tokens."""
        total = sum(self.prompt_tokens)
        return self.hit_tokens / total if total else 0.0

    def summary(self) -> dict[str, Any]:
        """Plain numbers: hit rate, prefill tokens saved, evictions, checkpoint bytes, waits."""
        return {"num_blocks": self.num_blocks, "hit_rate": self.hit_rate, "prefill_tokens_saved": self.hit_tokens,
                "prompt_tokens": sum(self.prompt_tokens), "num_evictions": self.num_evictions,
                "num_resumes": self.num_resumes, "checkpoint_bytes": self.checkpoint_bytes,
                "num_waits": self.num_waits, "wait_s": self.wait_s, **self.info}


@contextmanager
def no_cycle_collection() -> Iterator[None]:
    """Python's cyclic garbage collector paused inside. A replay allocates millions of small tuples, lists and
    sets and makes no reference cycles, so the collector's passes over them find nothing; they took about 40%
    of a replay's time (agentx at 0.1 of its working set: off 3.2 s -> 1.7 s, evict 6.2 s -> 4.3 s)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def replay(stream: CacheStream, geometry: CacheGeometry, num_blocks: int, free_list, *,
           resume: Resume | None, keys: list[list] | None = None) -> CacheStats:
    """Replay `stream` through a pool of `num_blocks` blocks: admissions at arrival, frees at finish, in time
    order. A request that finds too few free blocks waits for finishes (later turns of its session shift by
    the wait); one that cannot fit in the empty pool is a CapacityError naming it. `keys`: the stream's
    `stream_keys` at the geometry's block size, when several replays share them."""
    with no_cycle_collection():
        return _replay(stream, geometry, num_blocks, free_list, resume=resume, keys=keys)


def _replay(stream: CacheStream, geometry: CacheGeometry, num_blocks: int, free_list, *,
            resume: Resume | None, keys: list[list] | None) -> CacheStats:
    pool = HybridPool(geometry, num_blocks, free_list, resume=resume, chunk_size=stream.chunk_size)
    if hasattr(free_list, "bind"):
        free_list.bind(pool)
    requests = stream.requests
    hits = [0] * len(requests)
    delay: dict[str | None, float] = {}
    events: list[tuple[float, int, int]] = [(r.arrival_s, 1, i) for i, r in enumerate(requests)]
    heapq.heapify(events)
    waiting: list[int] = []
    if keys is None:
        keys = stream_keys(stream, geometry.block_size)
    elif len(keys) != len(requests):
        raise ValueError(f"keys: {len(keys)} lists for {len(requests)} requests")
    num_waits, wait_s = 0, 0.0
    arrived: dict[int, float] = {}
    peak = [0]

    def try_admit(i: int, now: float) -> bool:
        r = requests[i]
        previous = requests[r.continues] if r.continues is not None else None
        hit = pool.admit(i, r, keys[i], previous, now)
        if hit is None:
            return False
        hits[i] = hit
        peak[0] = max(peak[0], num_blocks - pool.num_free())
        heapq.heappush(events, (now + (r.finish_s - r.arrival_s), 0, i))
        return True

    while events:
        now, kind, i = heapq.heappop(events)
        r = requests[i]
        if kind == 0:
            pool.finish(i, r, now)
            while waiting and try_admit(waiting[0], now):
                j = waiting.pop(0)
                late = now - arrived[j]
                num_waits, wait_s = num_waits + 1, wait_s + late
                s = requests[j].session
                delay[s] = delay.get(s, 0.0) + late
            continue
        start = r.arrival_s + delay.get(r.session, 0.0) if r.session is not None else r.arrival_s
        if start > now:
            heapq.heappush(events, (start, 1, i))
            continue
        arrived[i] = now
        pool.free.note_admit(r.session, now, i, r.parent)
        if waiting or not try_admit(i, now):
            need = pool.blocks_needed(r, 0)
            if need > num_blocks:
                raise CapacityError(f"{stream.source or 'stream'}: request {i} ({r.num_prompt_tokens} prompt + "
                                    f"{r.num_output_tokens} output tokens) needs {need} blocks of "
                                    f"{geometry.block_size} tokens; the pool has {num_blocks}")
            waiting.append(i)
    if waiting:
        raise CapacityError(f"{stream.source or 'stream'}: requests {waiting[:5]} never fit in {num_blocks} blocks")
    return CacheStats(num_blocks=num_blocks, hits=hits, prompt_tokens=[r.num_prompt_tokens for r in requests],
                      num_evictions=pool.num_evictions, num_resumes=pool.num_resumes,
                      checkpoint_bytes=pool.checkpoint_bytes, num_waits=num_waits, wait_s=wait_s,
                      info={"peak_running_blocks": peak[0]})
