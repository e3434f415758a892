"""Resume at B=4: a turn's end kept as a state and a partial block, and what is left when one of them is evicted."""

import pytest
from cache_retention_helpers import TOY, request, tokens

from opts.k3.cache import RESUME_BLOCK, RESUME_STATE, Resume, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.stream import CacheStream


class EvictFirst(LruFreeList):
    """vLLM's queue, except that a free block cached as `kind` is reused first."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def bind(self, pool) -> None:
        self.pool = pool

    def pop(self) -> int:
        for block_id in self.order():
            key = self.pool.key_of.get(block_id)
            if key is not None and key[0] == self.kind:
                self.remove(block_id)
                return block_id
        return super().pop()


def resume_stream(b_prompt: int = 1) -> CacheStream:
    """A0: 9 prompt + 2 output (10 processed); B0 (no session, `b_prompt` + 1) in between; A1: A0's 11 + 3."""
    a = tokens("a", 15)
    return CacheStream((request(0, 1, a, 9, 2, "A"), request(1.5, 1.6, tokens("b", b_prompt + 1), b_prompt, 1),
                        request(2, 3, a, 14, 1, "A", continues=0)), 4)


@pytest.mark.parametrize(("kind", "hit"), [(None, 10), (RESUME_BLOCK, 8), (RESUME_STATE, 8)])
def test_a_resume_needs_the_partial_block_and_the_state(kind, hit):
    """A0 ends at 10: a state and block 2 (tokens 8-9) kept; A1 resumes at 10. B0 evicting either one alone leaves
    the stock hit: A1's leading blocks 0-1 (block 2 was never full) and A0's checkpoint state at floor(8/4)*4 = 8.
    B0 (1 + 1) pops a state and a block: the first one evicts the kept block of `kind`."""
    free_list = LruFreeList() if kind is None else EvictFirst(kind)
    stats = replay(resume_stream(), TOY, 16, free_list, resume=Resume())
    assert stats.hits == [0, 0, hit]
    assert stats.num_resumes == (kind is None)
    assert stats.num_evictions == (kind is not None)
    assert stats.checkpoint_bytes == 2 * TOY.state_bytes


def test_lru_evicts_the_checkpoint_state_before_the_turn_end():
    """At finish A0's free cached blocks are, oldest first: its state at 8 (freed at prefill), the turn end's state,
    its partial block, blocks 1 and 0: 5 of a pool of 6. B0 (1 + 1, 2 pops) evicts the state at 8, which resume does
    not need: 10. B0 (5 + 1, 4 pops) also evicts the turn end's state and block: blocks 0-1 without a state, 0."""
    assert replay(resume_stream(1), TOY, 6, LruFreeList(), resume=Resume()).hits == [0, 0, 10]
    assert replay(resume_stream(5), TOY, 6, LruFreeList(), resume=Resume()).hits == [0, 0, 0]


@pytest.mark.parametrize(("resume", "hit", "checkpoint_bytes"),
                         [(None, 8, 0), (Resume(), 12, 2), (Resume(at_prompt_tail=True, unit=1), 10, 2),
                          (Resume(at_prompt_tail=True, unit=3), 9, 2), (Resume(at_prompt_tail=True, unit=4), 8, 0)])
def test_where_a_turn_resumes(resume, hit, checkpoint_bytes):
    """A0: 11 + 2 (12 processed), A1: A0's 13 + 3. Stock: blocks 0-2 cached, state only at floor(10/4)*4 = 8. turn_end:
    12. prompt_tail: floor(10/unit)*unit (10, 9); with unit 4 that is 8, the checkpoint itself: nothing kept."""
    a = tokens("a", 17)
    stream = CacheStream((request(0, 1, a, 11, 2, "A"), request(2, 3, a, 16, 1, "A", continues=0)), 4)
    stats = replay(stream, TOY, 16, LruFreeList(), resume=resume)
    assert stats.hits == [0, hit]
    assert stats.checkpoint_bytes == checkpoint_bytes


def test_a_resume_skips_the_checkpoint_a_recompute_would_cache():
    """A0: 8 + 3 (state at 4, end at 10), A1: its 11 + 1, C: A's first 8 tokens + 4 own, unbounded pool. Off's A1 hits 4
    and recomputes to its checkpoint floor(11/4)*4 = 8, caching a state there: C hits 8. Resume's A1 starts at 10,
    past 8: no state at 8, C hits 4. On is ahead in total (14 vs 12), not on every request."""
    a = tokens("a", 14)
    stream = CacheStream((request(0, 1, a, 8, 3, "A"), request(2, 3, a, 12, 1, "A", continues=0),
                          request(4, 5, a[:8] + tokens("c", 6), 12, 1, "C")), 4)
    assert replay(stream, TOY, 64, LruFreeList(), resume=None).hits == [0, 4, 8]
    assert replay(stream, TOY, 64, LruFreeList(), resume=Resume()).hits == [0, 10, 4]


def test_a_prompt_tail_is_hit_by_content_and_a_partial_hit_copies_its_block():
    """prompt_tail, unit 1: A0's prompt of 10 keeps its tail at 9 (a state copy; block 2, tokens 8-11, named at 9 in
    place). S, a sub-agent whose prompt starts with A0's 10, resumes there: vLLM's lookup is by content, not by session
    (by session S would hit A0's checkpoint at 8). S copies block 2 to a block of its own (copy on write), so the tail
    stays cached for A1, A0's next turn (had S taken the block over, A1 would hit 8). Chunks of one token, so that
    content is named exactly."""
    a = tokens("a", 16)
    stream = CacheStream((request(0, 1, a, 10, 2, "A", chunk_size=1),
                          request(2, 3, a[:10] + tokens("s", 4), 14, 1, "S", chunk_size=1, parent="A"),
                          request(4, 5, a, 15, 1, "A", continues=0, chunk_size=1)), 1)
    stats = replay(stream, TOY, 64, LruFreeList(), resume=Resume(at_prompt_tail=True, unit=1))
    assert stats.hits == [0, 9, 9]
    assert stats.num_resumes == 2


class Watching(LruFreeList):
    """vLLM's queue; keeps the pool, counts pops of a block that holds a second name (a prompt tail's) and checks
    that every block the pool allocates comes without a name."""

    def bind(self, pool) -> None:
        self.pool, self.second_names_evicted = pool, 0
        alloc_many = pool._alloc_many

        def checked(n, session):
            bids = alloc_many(n, session)
            assert not any(b in pool.key_of or b in pool.extra for b in bids), "an allocated block kept a name"
            return bids
        pool._alloc_many = checked

    def pop(self) -> int:
        block_id = super().pop()
        self.second_names_evicted += block_id in self.pool.extra
        return block_id


def test_the_pool_s_names_stay_consistent_when_prompt_tails_are_evicted():
    """agentx_small through the tiny model's pool at 40 blocks with prompt tails (unit 16): whatever the evictions,
    an allocated block holds no name, every name the pool lists is one a block holds (its name or a second one,
    once), and the tails it counts are the resume states it holds."""
    from collections import Counter

    from ablations.workload import generate, preset
    from ablations.workload.cache_stream import cache_stream
    from opts.k3.cache.geometry import TINY

    free_list = Watching()
    stats = replay(cache_stream(generate(preset("agentx_small"), seed=0)), TINY, 40, free_list,
                   resume=Resume(at_prompt_tail=True, unit=16))
    pool = free_list.pool
    assert stats.num_resumes > 0 and free_list.second_names_evicted > 0
    listed = Counter((key, bid) for key, bids in pool.cached.items() for bid in bids)
    held = Counter([(key, bid) for bid, key in pool.key_of.items()]
                   + [(key, bid) for bid, keys in pool.extra.items() for key in keys])
    assert listed == held and max(listed.values()) == 1
    assert pool.tails == Counter(pool.depth[bid] for bid, key in pool.key_of.items()
                                 if key[0] == RESUME_STATE and key[1] == 0)
