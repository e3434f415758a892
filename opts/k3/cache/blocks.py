"""The block store of vLLM 0.32's hybrid pool: pool blocks, their names (hashes) and reference counts, the free
list they are reused in, allocation with eviction, and vLLM's `free_blocks` order. The first part of `HybridPool`
(`pool.py`); `lookup.py` finds a request's hit in it, `resume.py` keeps resume points in it."""

from __future__ import annotations

from dataclasses import dataclass, field

from opts.k3.cache.geometry import CacheGeometry

ATTN, STATE, RESUME_STATE, RESUME_BLOCK = "a", "s", "rs", "rb"


@dataclass
class Running:
    """What a running request holds: per attention group its blocks, its current state blocks, how many of its
    blocks are named, and what it named ahead of its computation or as states."""

    attn: list[list[int]]
    state: list[int] | None
    num_hashed: int
    session: str | None
    next_block: int = 0     # the decode block `grow` allocates next (its index k: tokens k·B + 1 onward)
    stops: tuple[int, ...] = ()     # where its prefill's chunks must end (`prefill_stops`)
    ahead: list[tuple[int, int]] = field(default_factory=list)     # (depth, block) named before being computed
    states: list[tuple[int, tuple]] = field(default_factory=list)     # the states it named: (block, name)
    cow: list[int] | None = None     # a prompt tail hit's partial blocks, copied by its first step (copy on write)


class BlockStore:
    """`num_blocks` usable pool blocks (vLLM's null block not counted), reused in `free_list`'s order."""

    def _init_blocks(self, geometry: CacheGeometry, num_blocks: int, free_list) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: invalid value {num_blocks!r}; valid: an integer >= 1")
        self.geometry = geometry
        self.block_size = geometry.block_size
        self.num_blocks = num_blocks
        self._num_groups = {ATTN: geometry.num_attn_groups, RESUME_BLOCK: geometry.num_attn_groups,
                            STATE: geometry.num_state_groups, RESUME_STATE: geometry.num_state_groups}
        self.free = free_list
        self.free.prepend(list(range(1, num_blocks + 1)))
        self.ahead: dict[int, int] = {}     # progressive: block -> the running request that names it ahead of time
        self.cached: dict[tuple, list[int]] = {}
        self.key_of: dict[int, tuple] = {}
        self.depth: dict[int, int] = {}
        self.ref: dict[int, int] = {}
        self.tails: dict[int, int] = {}     # resume states cached (first group), by the token they resume at
        self.extra: dict[int, list[tuple]] = {}     # a block's names besides key_of's (a prompt tail's partial block)
        self.num_evictions = 0
        self.version = 0        # bumped by every change a lookup can see (names, readiness): find_hit's memo

    def _touch(self, block_ids: list[int], session: str | None) -> None:
        """A request of `session` holds `block_ids` too: those nobody held leave the free list. In C loops (map,
        zip) when the blocks are distinct: this runs for every block of every hit. (A prompt whose chunk ids
        repeat, which prefix hashes never do, names one block at two places: one by one.)"""
        ref, free = self.ref, self.free
        if len(set(block_ids)) < len(block_ids):
            for bid in block_ids:
                if ref[bid] == 0:
                    free.remove(bid)
                ref[bid] += 1
        else:
            refs = list(map(ref.__getitem__, block_ids))
            if 0 in refs:
                free.remove_many([bid for bid, n in zip(block_ids, refs, strict=True) if not n])
            ref.update(zip(block_ids, map((1).__add__, refs), strict=True))
        free.note_uses(block_ids, session)

    def _alloc(self, session: str | None) -> int:
        return self._alloc_many(1, session)[0]

    def _alloc_many(self, n: int, session: str | None) -> list[int]:
        """`n` blocks popped from the free list one by one, each one's hash evicted before the next pop (the
        free list may read the pool's names); the request of `session` holds them."""
        pop, key_of, cached, ref = self.free.pop, self.key_of, self.cached, self.ref
        bids = []
        evicted = 0
        for _ in range(n):
            bid = pop()
            key = key_of.pop(bid, None)
            if key is not None:
                self.version += 1
                self.ahead.pop(bid, None)
                if key[0] == RESUME_STATE:
                    self._untail(key, bid)
                same = cached[key]
                if len(same) == 1:
                    del cached[key]
                else:
                    same.remove(bid)
                if bid in self.extra:
                    self._drop_extra(bid)
                evicted += 1
            ref[bid] = 1
            bids.append(bid)
        self.num_evictions += evicted
        self.free.note_uses(bids, session)
        return bids

    def _hash(self, bid: int, full_key: tuple, depth: int) -> None:
        self.version += 1
        self.key_of[bid] = full_key
        self.depth[bid] = depth
        self.cached.setdefault(full_key, []).append(bid)
        if full_key[0] == RESUME_STATE and full_key[1] == 0:
            self.tails[depth] = self.tails.get(depth, 0) + 1

    def _untail(self, key: tuple, bid: int) -> None:
        """A resume state's name is gone: one fewer cached resume point at its depth."""
        if key[1] == 0:
            depth = self.depth[bid]
            left = self.tails[depth] - 1
            if left:
                self.tails[depth] = left
            else:
                del self.tails[depth]

    def _drop_extra(self, bid: int) -> None:
        self.version += 1
        for key in self.extra.pop(bid):
            bids = self.cached[key]
            bids.remove(bid)
            if not bids:
                del self.cached[key]

    def _unhash(self, bid: int) -> None:
        self.version += 1
        self.ahead.pop(bid, None)
        if bid in self.extra:
            self._drop_extra(bid)
        key = self.key_of.pop(bid)
        if key[0] == RESUME_STATE:
            self._untail(key, bid)
        bids = self.cached[key]
        bids.remove(bid)
        if not bids:
            del self.cached[key]

    def _free(self, block_ids: list[int]) -> None:
        """vLLM's free_blocks of `block_ids`: those no request holds any more go to the free list, without a hash
        to the front (in order), cached ones to the back. In C loops when the blocks are distinct (`_touch`)."""
        ref, key_of = self.ref, self.key_of
        if len(set(block_ids)) < len(block_ids):
            freed = []
            for bid in block_ids:
                ref[bid] -= 1
                if ref[bid] == 0:
                    freed.append(bid)
        else:
            left = list(map((-1).__add__, map(ref.__getitem__, block_ids)))
            ref.update(zip(block_ids, left, strict=True))
            if 0 not in left:
                return
            freed = [bid for bid, n in zip(block_ids, left, strict=True) if not n]
        cached = [bid for bid in freed if bid in key_of]
        if cached:
            self.free.append_many(cached)
        if len(cached) < len(freed):
            self.free.prepend([bid for bid in freed if bid not in key_of])

    def num_free(self) -> int:
        return len(self.free)
