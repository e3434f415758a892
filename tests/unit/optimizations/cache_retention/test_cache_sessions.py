"""Hand-worked sessions at B=4 (toy geometry): two sessions interleaved, and a sub-agent fork."""

import pytest
from cache_retention_helpers import TOY, chunk_ids, recording, request, tokens

from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.evict import SessionFreeList
from opts.cache_retention.reference import run_unbounded
from opts.cache_retention.retention import run
from opts.k3.cache import Resume, replay
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.stream import CacheStream, name


def two_sessions(times: list[float]) -> CacheStream:
    """A0, B0, A1, B1 at `times`, 0.5 s each: turn 0 is 8 prompt + 1 output, turn 1 its 9 tokens + 3 new + 1."""
    a, b = tokens("a", 13), tokens("b", 13)
    t = times
    return CacheStream((request(t[0], t[0] + 0.5, a, 8, 1, "A"), request(t[1], t[1] + 0.5, b, 8, 1, "B"),
                        request(t[2], t[2] + 0.5, a, 12, 1, "A", continues=0),
                        request(t[3], t[3] + 0.5, b, 12, 1, "B", continues=1)), 4)


def hits(stream: CacheStream, num_blocks: int, idle_s: float = 30.0) -> dict[str, list[int]]:
    return {mode: run(stream, TOY, num_blocks, CacheRetentionConfig(mode=mode, idle_s=idle_s)).hits
            for mode in ("off", "evict", "resume", "on")}


def test_two_sessions_interleaved_at_8_blocks():
    """Turn 0 caches its state at floor(7/4)*4 = 4 and blocks 0-1; turn 1 (prompt 12) finds blocks 0-1 and the state at
    4: off 4. A1 recomputes 4..11 with 4 pops: the 2 unhashed blocks left, then the LRU head, A0's block 1 and B0's
    state at 4, so B1 gets 0. Both sessions live, one holder per block: evict ties and runs LRU, = off."""
    stream = two_sessions([0, 1, 2, 3])
    assert run_unbounded(stream, TOY).hits == [0, 0, 8, 8]
    assert hits(stream, 8) == {"off": [0, 0, 4, 0], "evict": [0, 0, 4, 0], "resume": [0, 0, 8, 8], "on": [0, 0, 8, 8]}


def test_two_sessions_resume_at_their_turn_end():
    """Turn 0 processes 8 tokens: its end is kept as a state at 8 (aligned: no partial block); A1 resumes at 8 and pops
    only a state and block 2: the LRU head, A0's then B0's state at 4, which resume no longer needs: B1 resumes at 8."""
    stream = two_sessions([0, 1, 2, 3])
    free_list = recording(LruFreeList)()
    stats = replay(stream, TOY, 8, free_list, resume=Resume())
    assert stats.hits == [0, 0, 8, 8] and stats.num_resumes == 2
    a4, b4 = chunk_ids(tokens("a", 4), 4)[0], chunk_ids(tokens("b", 4), 4)[0]
    evicted = [key for time_s, _, key in free_list.pops if time_s == 2]
    assert evicted == [("s", 0, name(a4, 4, 4)), ("s", 0, name(b4, 4, 4))]


def test_evict_takes_an_idle_sessions_blocks_first():
    """One more block (9): off's A1 evicts only A0's block 1, which it recomputes, and B1 finds the state at 4: 4.
    With idle_s 1.2, B is idle at A1 (1.5 + 1.2 < 4): evict takes B0's state at 4 and keeps A0's stale block 1: B1 0."""
    stream = two_sessions([0, 1, 4, 5])
    assert hits(stream, 9, idle_s=1.2) == {"off": [0, 0, 4, 4], "evict": [0, 0, 4, 0], "resume": [0, 0, 8, 8],
                                           "on": [0, 0, 8, 8]}
    assert hits(stream, 9, idle_s=3.0)["evict"] == [0, 0, 4, 4]


@pytest.mark.parametrize(("parent_prompt", "hit"), [(8, 4), (9, 8), (13, 0)])
def test_a_sub_agent_hits_the_parents_blocks_up_to_a_cached_state(parent_prompt, hit):
    """The sub-agent's prompt is the parent's first 8 tokens + 4 of its own: blocks 0-1 are cached; the parent cached
    its state only at floor((prompt - 1)/4)*4: 4 (prompt 8), 8 (prompt 9), 12 (prompt 13, not on the shared part)."""
    parent, sub = tokens("p", 14), tokens("p", 8) + tokens("s", 6)
    stream = CacheStream((request(0, 0.5, parent, parent_prompt, 1, "P"),
                          request(1, 1.5, sub, 12, 1, "P/1", parent="P")), 4)
    assert run_unbounded(stream, TOY).hits == [0, 8]
    for mode in ("off", "evict", "resume", "on"):
        assert run(stream, TOY, 16, CacheRetentionConfig(mode=mode)).hits == [0, hit]


def sub_agent_stream() -> CacheStream:
    """P0 (9 + 1), its sub-agent P/1 (P's 8 + 4 own, 2 output) running 1-10 s, Q0 and R0 (5 + 1 each, unrelated), then
    a second sub-agent P/2 (P's 8 + 4 own) at 5 s."""
    p = tokens("p", 10)
    return CacheStream((request(0, 0.5, p, 9, 1, "P"), request(1, 10, p[:8] + tokens("s", 6), 12, 2, "P/1", parent="P"),
                        request(2, 2.5, tokens("q", 6), 5, 1, "Q"), request(4, 4.5, tokens("r", 6), 5, 1, "R"),
                        request(5, 5.5, p[:8] + tokens("t", 5), 12, 1, "P/2", parent="P")), 4)


def test_a_shared_prefix_outlives_an_idle_sessions_block_under_evict():
    """11 blocks. P/1 hits 8 (P0's state at 8) and holds blocks 0-1, its blocks 2-3 and a state; the state at 8 is free
    again. Q0 leaves its state at 4 and block 0 cached. R0's 4 pops find 3 unhashed blocks, then evict one: off the
    LRU head, P's state at 8, so P/2 hits 0; evict Q's state at 4 (Q idle since 3.5 s; P/1 running keeps P/1 and P
    live): P/2 hits 8."""
    stream = sub_agent_stream()
    p8, q4 = chunk_ids(tokens("p", 8), 8)[1], chunk_ids(tokens("q", 4), 4)[0]
    cases = [(recording(LruFreeList)(), [0, 8, 0, 0, 0], ("s", 0, name(p8, 4, 4))),
             (recording(SessionFreeList)(1.0), [0, 8, 0, 0, 8], ("s", 0, name(q4, 4, 4)))]
    for free_list, hit, evicted in cases:
        stats = replay(stream, TOY, 11, free_list, resume=None)
        assert stats.hits == hit
        assert [key for time_s, _, key in free_list.pops if key is not None and time_s < 5] == [evicted]


def test_a_sub_agent_caches_the_state_where_it_leaves_the_shared_prefix():
    """P0 (13 + 1) caches blocks 0-2 and its state only at 12. P/1 (P's 8 + 12 own) finds blocks 0-1 and no state: 0;
    its prefill stops at the junction 8 (before its checkpoint 16) and caches the state there: P/2 (P's 8 + 12 other)
    hits 8."""
    p = tokens("p", 14)
    stream = CacheStream((request(0, 1, p, 13, 1, "P"),
                          request(2, 3, p[:8] + tokens("s", 13), 20, 1, "P/1", parent="P"),
                          request(4, 5, p[:8] + tokens("t", 13), 20, 1, "P/2", parent="P")), 4)
    assert run_unbounded(stream, TOY).hits == [0, 8, 8]
    for mode in ("off", "evict", "resume", "on"):
        assert run(stream, TOY, 32, CacheRetentionConfig(mode=mode)).hits == [0, 0, 8]
