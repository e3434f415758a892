"""evict's reuse order: live holders, causality (decisions before t ignore what comes after t), and when it is LRU."""

import dataclasses
from types import SimpleNamespace

import pytest
from cache_retention_helpers import recording

from ablations.workload import generate, preset
from ablations.workload.cache_stream import cache_stream
from opts.cache_retention.evict import SessionFreeList
from opts.cache_retention.reference import BeladyFreeList
from opts.k3.cache import ATTN, Resume, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import TINY
from opts.k3.cache.stream import CacheStream


@pytest.fixture(scope="module")
def stream() -> CacheStream:
    return cache_stream(generate(preset("agentx_small"), seed=0))


def test_order_fewest_live_holders_then_least_recently_freed():
    """Unhashed blocks first, then 5, 6, 7 (one live holder each, in the order freed), 8 (two live holders). At 1.5 s
    C (finished at 0, idle_s 1) is idle: 7 has no live holder and goes first."""
    free_list = SessionFreeList(idle_s=1.0)
    free_list.prepend([1, 2, 3, 4, 5, 6, 7, 8])
    for block_id in (5, 6, 7, 8):
        free_list.remove(block_id)
    for block_id, sessions in ((5, ["A"]), (6, ["B"]), (7, ["C"]), (8, ["A", "B"])):
        for session in sessions:
            free_list.note_use(block_id, session)
    for index, session in enumerate(("A", "B", "C")):
        free_list.note_admit(session, 0.0, index)
    free_list.note_finish("C", 0.0, 2)
    for block_id in (5, 6, 7, 8):
        free_list.append(block_id)
    assert free_list.order() == [1, 2, 3, 4, 5, 6, 7, 8]
    free_list.note_admit("D", 1.5, 3)
    assert free_list.order() == [1, 2, 3, 4, 7, 5, 6, 8]
    assert [free_list.pop() for _ in range(8)] == [1, 2, 3, 4, 7, 5, 6, 8]


def changed_after(stream: CacheStream, t: float) -> CacheStream:
    """The same requests before `t`; after it, other content (chunk ids) and twice the output."""
    requests = [r if r.arrival_s < t else dataclasses.replace(
        r, num_output_tokens=2 * r.num_output_tokens, finish_s=r.finish_s + r.num_output_tokens / 50,
        chunk_ids=tuple(10**9 + c for c in r.chunk_ids)) for r in stream.requests]
    return CacheStream(tuple(requests), stream.chunk_size)


@pytest.mark.parametrize("resume", [None, Resume()])
@pytest.mark.parametrize("num_blocks", [60, 80])
def test_evict_decisions_before_t_ignore_the_requests_after_t(stream, resume, num_blocks):
    """Every pop (time, block, evicted name) before t is the same in three streams equal up to t: the stream itself,
    one with other requests after t, and one that stops at t (60 blocks: one request waits, 80: none)."""
    t = stream.requests[len(stream.requests) // 2].arrival_s
    streams = [stream, changed_after(stream, t), CacheStream(tuple(r for r in stream.requests if r.arrival_s < t),
                                                             stream.chunk_size)]
    pops = []
    for s in streams:
        free_list = recording(SessionFreeList)(idle_s=30.0)
        replay(s, TINY, num_blocks, free_list, resume=resume)
        pops.append(free_list.pops)
    before = [[p for p in run if p[0] < t] for run in pops]
    assert sum(key is not None for _, _, key in before[0]) > 10
    assert before[1] == before[0] and before[2] == before[0]
    assert pops[1] != pops[0]


def private(stream: CacheStream) -> CacheStream:
    """`stream` with every chunk id made private to its session: no block can have two holders."""
    names: dict[tuple, int] = {}
    return CacheStream(tuple(dataclasses.replace(r, chunk_ids=tuple(names.setdefault((r.session, c), len(names))
                                                                    for c in r.chunk_ids))
                             for r in stream.requests), stream.chunk_size)


@pytest.mark.parametrize("resume", [None, Resume()])
@pytest.mark.parametrize("num_blocks", [40, 80, 160])
def test_evict_is_lru_with_one_holder_per_block_and_no_idle_session(stream, resume, num_blocks):
    """Every free cached block then has exactly one live holder: fewest live holders always ties and evict pops in
    LRU order, block for block."""
    s = private(stream)
    lru, evict = recording(LruFreeList)(), recording(SessionFreeList)(idle_s=1e9)
    off, on = replay(s, TINY, num_blocks, lru, resume=resume), replay(s, TINY, num_blocks, evict, resume=resume)
    assert on.num_evictions > 0
    assert evict.pops == lru.pops
    assert (on.hits, on.num_evictions, on.num_waits) == (off.hits, off.num_evictions, off.num_waits)


def test_belady_reuses_the_furthest_next_use_first_not_counting_the_request_being_served():
    """At request 5, which reads block A (A read again at 9) and not B (read at 7): A's next use is 9, so A goes
    first; counting request 5 itself as A's next use would keep A and evict B."""
    key_a, key_b, key_c = (ATTN, 0, "a"), (ATTN, 0, "b"), (ATTN, 0, "c")
    free = BeladyFreeList({(ATTN, "a"): [2, 5, 9], (ATTN, "b"): [7], (ATTN, "c"): [3]})
    free.bind(SimpleNamespace(key_of={1: key_a, 2: key_b, 3: key_c}, depth={1: 0, 2: 0, 3: 0},
                              cached={key_a: [1], key_b: [2], key_c: [3]}))
    free.note_admit(None, 0.0, 5)
    for block in (2, 1, 3):
        free.append(block)
    assert [free.pop(), free.pop(), free.pop()] == [3, 1, 2], "c: never again; a: at 9; b: at 7"


@pytest.mark.parametrize("resume", [None, Resume()])
def test_evict_forgets_each_request_when_it_finishes(stream, resume):
    free_list = SessionFreeList(idle_s=30.0)
    replay(stream, TINY, 400, free_list, resume=resume)
    assert free_list.num_open_requests == 0
    free_list.note_admit("a", 0.0, 7)
    free_list.note_admit("a", 0.0, 7)
    assert free_list.num_open_requests == 1
    free_list.note_finish("a", 1.0, 7)
    free_list.note_finish("a", 1.0, 7)
    assert free_list.num_open_requests == 0


@pytest.mark.parametrize("resume", [None, Resume()])
def test_a_compacted_heap_pops_the_blocks_a_full_one_does(stream, resume):
    """`pop` rebuilds its heap from the live entries once the entries hits and re-rankings left behind outnumber
    them: every pop (time, block, evicted name) the same as with every entry kept, and the hits too."""

    class Kept(SessionFreeList):
        def _compact(self) -> None:
            pass

    class Counted(SessionFreeList):
        compactions = 0

        def _compact(self) -> None:
            self.compactions += 1
            super()._compact()

    kept, compacted = recording(Kept)(idle_s=30.0), recording(Counted)(idle_s=30.0)
    full, small = replay(stream, TINY, 80, kept, resume=resume), replay(stream, TINY, 80, compacted, resume=resume)
    assert compacted.compactions > 0 and len(compacted._heap) < len(kept._heap)
    assert compacted.pops == kept.pops and sum(key is not None for _, _, key in kept.pops) > 10
    assert (small.hits, small.num_evictions) == (full.hits, full.num_evictions)
