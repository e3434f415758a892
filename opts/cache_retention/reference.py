"""References for the hit rates: the unbounded cache (an upper bound) and Belady's furthest-next-use order.

Unbounded: every block and every KDA state at every block boundary and turn end kept forever; a request hits
its longest run of leading blocks seen before, or its previous turn's end. No policy at any capacity does
better. Belady: on's mechanics (resume) with the free cached block whose content is next needed furthest in
the future reused first. A reference point, not a bound: a block is only useful with its whole prefix, which
furthest-next-use ignores.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right

from opts.k3.cache import ATTN, STATE, CacheStats, Resume, replay, stream_keys
from opts.k3.cache.free_list import RankedFreeList
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.stream import CacheStream, prefix_key

INF = float("inf")


def run_unbounded(stream: CacheStream, geometry: CacheGeometry, keys_of: list[list] | None = None) -> CacheStats:
    """Hits of a cache with no capacity limit; `info["working_set_blocks"]` is what it holds at the end.
    `keys_of`: the stream's `pool.stream_keys` at the geometry's block size, when computed already."""
    size, seen = geometry.block_size, set()
    hits, states = [], set()
    if keys_of is None:
        keys_of = stream_keys(stream, size)
    for i, r in enumerate(stream.requests):
        keys = keys_of[i]
        limit = (r.num_prompt_tokens - 1) // size
        leading = 0
        while leading < limit and keys[leading] in seen:
            leading += 1
        hit = leading * size
        if r.continues is not None:
            point = stream.requests[r.continues].num_processed_tokens
            if hit < point <= r.num_prompt_tokens - 1:
                hit = point
        hits.append(hit)
        seen.update(keys)
        states.add(("c", i))
        if r.session is not None:
            states.add(("t", i))
    working = len(seen) * geometry.num_attn_groups + len(states) * geometry.num_state_groups
    return CacheStats(num_blocks=working, hits=hits, prompt_tokens=[r.num_prompt_tokens for r in stream.requests],
                      info={"working_set_blocks": working})


class BeladyFreeList(RankedFreeList):
    """Free blocks, cached ones reused furthest next use first (next use: the next request that reads the
    block's content from an unbounded cache, from the whole stream), the deepest in its prefix first among
    equals. Of two copies of the same content only the first is read (hits take it): the other goes first."""

    def __init__(self, uses: dict) -> None:
        super().__init__()
        self._uses = uses
        self._key_of: dict = {}
        self._depth: dict = {}
        self._cached: dict = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.position = -1
        self._uses_of: dict = {}

    def bind(self, pool) -> None:
        """Read block names from `pool`."""
        self._key_of = pool.key_of
        self._depth = pool.depth
        self._cached = pool.cached

    def _next_use(self, block_id: int) -> tuple[float, bool]:
        """(the block's next use after the current position, whether it is a second copy of its content)."""
        key = self._key_of.get(block_id)
        if key is None:
            return INF, False
        if self._cached[key][0] != block_id:
            return INF, True
        uses = self._uses_of.get(key)
        if uses is None:    # the name's uses, looked up once per name (a block is pushed many times)
            uses = self._uses_of[key] = self._uses.get((ATTN if key[0] == ATTN else STATE, key[2]), ())
        if not uses:
            return INF, False
        k = bisect_right(uses, self.position)
        return (uses[k] if k < len(uses) else INF), False

    def append(self, block_id: int) -> None:
        self._seq += 1
        self._push(block_id, self._seq)

    def append_many(self, block_ids: list[int]) -> None:
        """`append` for each block in order (inlined: this runs for every block a request frees)."""
        next_use, entry, heap, depth, position = self._next_use, self._entry, self._heap, self._depth, self.position
        seq = self._seq
        for block_id in block_ids:
            seq += 1
            nxt, second = next_use(block_id)
            entry[block_id] = (nxt, seq, position, second)
            heapq.heappush(heap, (-nxt, -depth.get(block_id, 0), seq, block_id))
        self._seq = seq

    def _push(self, block_id: int, seq: int) -> None:
        nxt, second = self._next_use(block_id)
        # With the next use: the position it was computed at and whether the block was a second copy, so
        # that `pop` recomputes it only when it can have changed.
        self._entry[block_id] = (nxt, seq, self.position, second)
        heapq.heappush(self._heap, (-nxt, -self._depth.get(block_id, 0), seq, block_id))

    def remove(self, block_id: int) -> None:
        if block_id in self._plain:
            del self._plain[block_id]
        else:
            del self._entry[block_id]

    def pop(self) -> int:
        block_id = self._pop_plain()
        if block_id is not None:
            return block_id
        heap, entries, position, next_use = self._heap, self._entry, self.position, self._next_use
        pop, push = heapq.heappop, heapq.heappush
        while True:
            item = pop(heap)
            neg, _, seq, block_id = item
            entry = entries.get(block_id)
            if entry is None or entry[0] != -neg or entry[1] != seq:
                continue
            # A free block's name (and depth) stays, so its next use can only have changed if the position moved
            # past it or back before it was computed, or if it was a second copy (the first may have gone since).
            nxt, _, at, second = entry
            if second or nxt <= position or position < at:
                now, second = next_use(block_id)
                if now != nxt:
                    entries[block_id] = (now, seq, position, second)
                    push(heap, (-now, item[1], seq, block_id))
                    continue
            del entries[block_id]
            return block_id

    def note_use(self, block_id: int, session: str | None) -> None:
        pass

    def note_admit(self, session: str | None, now_s: float, index: int, parent: str | None = None) -> None:
        self.position = index

    def note_finish(self, session: str | None, now_s: float, index: int) -> None:
        pass


def block_uses(stream: CacheStream, geometry: CacheGeometry, keys_of: list[list] | None = None,
               unbounded: CacheStats | None = None) -> dict:
    """Block name -> sorted indices of the requests that read it from an unbounded cache: the blocks before
    their hit point, and the state (or turn end) at it. `keys_of` and `unbounded` (`run_unbounded`'s
    result): when computed already."""
    size, uses = geometry.block_size, {}
    if keys_of is None:
        keys_of = stream_keys(stream, size)
    hits = (unbounded or run_unbounded(stream, geometry, keys_of)).hits
    for i, (r, hit) in enumerate(zip(stream.requests, hits, strict=True)):
        if not hit:
            continue
        for key in keys_of[i][:hit // size]:
            uses.setdefault((ATTN, key), []).append(i)
        uses.setdefault((STATE, prefix_key(r, hit, stream.chunk_size)), []).append(i)
    return uses


def run_belady(stream: CacheStream, geometry: CacheGeometry, num_blocks: int, *, keys_of: list[list] | None = None,
               uses: dict | None = None) -> CacheStats:
    """Hits of on's mechanics (resume) reusing the furthest-next-use cached block first. `keys_of` and
    `uses` (`block_uses`): when several capacities share them."""
    if keys_of is None:
        keys_of = stream_keys(stream, geometry.block_size)
    free_list = BeladyFreeList(uses if uses is not None else block_uses(stream, geometry, keys_of))
    return replay(stream, geometry, num_blocks, free_list, resume=Resume(), keys=keys_of)
