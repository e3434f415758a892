"""A trace's chunk size differs from the engine block: blocks are named by the chunk holding their last token."""

import pytest
from cache_retention_helpers import TOY, request, tokens

from ablations.workload.cache_stream import cache_stream
from ablations.workload.trace import Request, Trace
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.reference import run_unbounded
from opts.cache_retention.retention import run
from opts.k3.cache import request_keys
from opts.k3.cache.geometry import TINY
from opts.k3.cache.stream import CacheStream, block_keys, name, prefix_key


def sixteen_token_trace() -> Trace:
    """Chunks of 16 tokens. s turn 0: 300 + 100 (its partial chunk 18 named 1018); s turn 1: its 400 tokens + 20
    (chunk ids 0-26); t: the first 17 chunks (272 tokens) of s, then its own 28 tokens."""
    return Trace((Request(0.0, 300, 100, (*range(18), 1018), session="s", turn=0),
                  Request(5000.0, 420, 10, tuple(range(27)), session="s", turn=1),
                  Request(10000.0, 300, 10, (*range(17), 2017, 2018), session="t", turn=0)), block_size=16)


def test_cache_stream_names_a_turn_by_the_next_turns_chunks():
    """Turn 0 takes turn 1's first ceil(400/16) = 25 ids; it finishes after 300/20000 + 100/50 = 2.015 s."""
    stream = cache_stream(sixteen_token_trace())
    first, second, third = stream.requests
    assert stream.chunk_size == 16
    assert first.chunk_ids == tuple(range(25)) and first.finish_s == pytest.approx(2.015)
    assert (second.continues, third.continues) == (0, None)


def test_tiny_blocks_of_128_over_chunks_of_16():
    """A 128-token block ends in chunk 8j+7 at offset 16: turn 0's 399 tokens hold blocks (7,16), (15,16), (23,16);
    its end is (24, 399-384 = 15). Stock: state only at floor(299/128)*128 = 256, so turn 1 and t (272 shared tokens,
    block 2 ends past them) hit 256; resume: turn 1 at 399."""
    stream = cache_stream(sixteen_token_trace())
    first = stream.requests[0]
    assert request_keys(first, 0, 128, 16) == [name(7, 16, 16), name(15, 16, 16), name(23, 16, 16)]
    assert prefix_key(first, 399, 16) == name(24, 15, 16)
    assert run_unbounded(stream, TINY).hits == [0, 399, 256]
    expected = {"off": [0, 256, 256], "evict": [0, 256, 256], "resume": [0, 399, 256], "on": [0, 399, 256]}
    for mode, hits in expected.items():
        assert run(stream, TINY, 64, CacheRetentionConfig(mode=mode)).hits == hits


def test_blocks_of_4_over_chunks_of_6():
    """Blocks end at 4, 8, 12: chunk 0 offset 4, chunk 1 offset 2, chunk 1 offset 6."""
    r = request(0, 1, tokens("x", 18), 14, 4, chunk_size=6)
    ids = r.chunk_ids
    assert block_keys(r, 12, 4, 6) == [name(ids[0], 4, 6), name(ids[1], 2, 6), name(ids[1], 6, 6)]


@pytest.mark.parametrize(("num_shared", "hit", "unbounded"), [(12, 12, 12), (6, 0, 4)])
def test_hits_land_on_engine_blocks_across_chunks_of_6(num_shared, hit, unbounded):
    """X (14 + 1) caches blocks to 12 and its state at floor(13/4)*4 = 12; Y shares X's first `num_shared` tokens
    (whole chunks of 6). 12 shared: blocks 0-2 and the state at 12. 6 shared: block 0 only, no state at 4: 0 (unbounded
    4)."""
    x = tokens("x", 15)
    y = x[:num_shared] + tokens("y", 20 - num_shared + 1)
    stream = CacheStream((request(0, 1, x, 14, 1, "X", chunk_size=6), request(2, 3, y, 20, 1, "Y", chunk_size=6)), 6)
    assert run_unbounded(stream, TOY).hits == [0, unbounded]
    assert run(stream, TOY, 32, CacheRetentionConfig(mode="off")).hits == [0, hit]
