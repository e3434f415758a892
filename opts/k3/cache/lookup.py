"""A request's hit in the hybrid pool: the leading cached attention blocks, the deepest cached KDA state among
them, or a deeper resume point (vLLM's `find_longest_cache_hit` for a hybrid model, "align" mode). Part of
`HybridPool` (`pool.py`)."""

from __future__ import annotations

from itertools import repeat

from opts.k3.cache.blocks import ATTN, RESUME_BLOCK, RESUME_STATE, STATE
from opts.k3.cache.resume import Tails
from opts.k3.cache.stream import CacheRequest, prefix_key

NEAR_BLOCKS = 8     # blocks below a prefix's end walked one by one for its deepest state (`_deepest_state`)


class Lookup(Tails):
    """Lookups by name; blocks named ahead of their computation (progressive) are not ready."""

    _memo: tuple | None = None

    def _lookup(self, kind: str, key) -> list[int] | None:
        """One block per group holding (kind, key), or None."""
        cached = self.cached
        if self._num_groups[kind] == 1:     # the common case, made cheap: this runs for every block of a hit
            bids = cached.get((kind, 0, key))
            bid = self._ready(bids) if bids else None
            return None if bid is None else [bid]
        found = []
        for g in range(self._num_groups[kind]):
            bids = cached.get((kind, g, key))
            bid = self._ready(bids) if bids else None
            if bid is None:
                return None
            found.append(bid)
        return found

    def _ready(self, bids: list[int]) -> int | None:
        """The first of `bids` (blocks of one name) that holds its content already (progressive), or None."""
        ahead = self.ahead
        if not ahead or bids[0] not in ahead:
            return bids[0]
        return next((b for b in bids if b not in ahead), None)

    def find_hit(self, request: CacheRequest, keys: list,
                 previous: CacheRequest | None) -> tuple[int, bool, list[list[int]]]:
        """(cached prompt tokens, whether they come from a resume point, the leading cached attention blocks: a
        list per group, the same length). With MTP the attention lookup reaches one block further (to the
        prompt's last full block) and drops its last block: the hit and the junction end one block earlier. The
        same request asked again before anything a lookup sees has changed (`version`) gets the same answer
        without a walk: the engine asks for the waiting head each step until it is admitted."""
        memo = self._memo
        if memo is not None and memo[0] == self.version and memo[1] is request and memo[2] is keys \
                and memo[3] is previous:
            return memo[4]
        out = self._find_hit(request, keys, previous)
        self._memo = (self.version, request, keys, previous, out)
        return out

    def _find_hit(self, request: CacheRequest, keys: list,
                  previous: CacheRequest | None) -> tuple[int, bool, list[list[int]]]:
        prompt = request.num_prompt_tokens
        limit = (prompt if self.speculative else prompt - 1) // self.block_size
        if self._num_groups[ATTN] == 1:     # the common case, in C loops: this runs for every block of every prompt
            hits = list(map(self.cached.get, zip(repeat(ATTN), repeat(0), keys[:limit])))
            if None in hits:                 # a cached name's list is never empty: None is the first miss
                del hits[hits.index(None):]
            column = [bids[0] for bids in hits]
            ahead = self.ahead
            if ahead and not ahead.keys().isdisjoint(column):
                column = []
                for bids in hits:
                    bid = bids[0]
                    if bid in ahead:
                        bid = self._ready(bids)
                        if bid is None:
                            break
                    column.append(bid)
            matched = [column]
        else:
            rows: list[list[int]] = []
            while len(rows) < limit:
                blocks = self._lookup(ATTN, keys[len(rows)])
                if blocks is None:
                    break
                rows.append(blocks)
            matched = [list(column) for column in zip(*rows, strict=True)] if rows \
                else [[] for _ in range(self._num_groups[ATTN])]
        found = [column[:-1] for column in matched] if self.speculative and matched[0] else matched
        j = self._deepest_state(keys, len(found[0]))
        hit = (j + 1) * self.block_size
        for point in self._resume_points(request, previous, hit):
            # the resume point's own checks (state, partial block) stand for vLLM's finer drop with MTP: one unit
            if point <= prompt - 1 and point // self.block_size <= len(matched[0]):
                key = prefix_key(request, point, self.chunk_size)
                if self._lookup(RESUME_STATE, key) is not None and (
                        point % self.block_size == 0 or self._lookup(RESUME_BLOCK, key) is not None):
                    return point, True, matched
        return hit, False, found

    def _deepest_state(self, keys: list, leading: int) -> int:
        """The deepest block j < `leading` whose KDA state is cached and ready in every group, or -1. The deepest
        is usually the previous turn's checkpoint a few blocks below the prefix's end: those blocks one by one,
        the rest by their first group's names in C loops (most blocks hold no state: a miss there settles it)."""
        get, one = self.cached.get, self._num_groups[STATE] == 1
        near = max(leading - NEAR_BLOCKS, 0)
        for j in range(leading - 1, near - 1, -1):
            bids = get((STATE, 0, keys[j]))
            if bids and (self._ready(bids) is not None if one else self._lookup(STATE, keys[j]) is not None):
                return j
        first = list(map(get, zip(repeat(STATE), repeat(0), keys[:near])))
        for j in [j for j in range(near - 1, -1, -1) if first[j] is not None]:
            if self._ready(first[j]) is not None if one else self._lookup(STATE, keys[j]) is not None:
                return j
        return -1

