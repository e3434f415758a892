"""The pool with MTP configured (vLLM's EAGLE rules for a hybrid model) and with states named ahead of the chunks
that compute them (`progressive`, as the simulated engine runs it)."""

import pytest
from cache_retention_helpers import request, tokens

from opts.k3.cache import HybridPool, Resume, checkpoints, request_keys
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import TINY


def _pool(speculative: bool, resume: Resume | None = None, progressive: bool = False) -> HybridPool:
    return HybridPool(TINY, 40, LruFreeList(), resume=resume, chunk_size=1, speculative=speculative,
                      progressive=progressive)


def _turns(session: str | None = None):
    """Turn 0: prompt 300, answer 100; turn 1: both and 20 more tokens of prompt (420), continuing turn 0."""
    first = tokens("a", 300) + tokens("o", 100)
    second = first + tokens("p", 30)
    return [request(0, 1, first, 300, 100, session, chunk_size=1),
            request(2, 3, second, 420, 10, session, continues=0, chunk_size=1)]


def _hits(pool: HybridPool, requests) -> list[int]:
    hits = []
    for i, r in enumerate(requests):
        previous = requests[r.continues] if r.continues is not None else None
        hits.append(pool.admit(i, r, request_keys(r, i, 128, 1), previous, 0.0))
        pool.finish(i, r, 0.0)
    return hits


def test_checkpoints_are_vllms_replay_boundaries():
    assert checkpoints(300, 128, speculative=False) == (256,)
    assert checkpoints(300, 128, speculative=True) == (128,)
    assert checkpoints(384, 128, speculative=True) == (128, 256)      # a resend's and an extension's differ
    assert checkpoints(100, 128, speculative=True) == checkpoints(100, 128, speculative=False) == ()


@pytest.mark.parametrize(("speculative", "hit"), [(False, 256), (True, 128)])
def test_with_mtp_a_turn_resumes_one_block_earlier(speculative, hit):
    """Turn 0 keeps its state at floor(299/128)*128 = 256, with MTP at floor(300/128)*128 - 128 = 128, and turn 1's
    attention lookup drops its last matched block (3 -> 2): vLLM's hits for an extension of a 300-token prompt."""
    pool = _pool(speculative)
    assert _hits(pool, _turns()) == [0, hit]


@pytest.mark.parametrize(("speculative", "hit"), [(False, 288), (True, 272)])
def test_with_mtp_the_prompt_tail_is_one_unit_earlier(speculative, hit):
    """prefix_match_unit 16: the tail at floor(299/16)*16 = 288, with MTP floor(300/16)*16 - 16 = 272."""
    pool = _pool(speculative, Resume(at_prompt_tail=True, unit=16))
    assert _hits(pool, _turns("S")) == [0, hit]


@pytest.mark.parametrize(("speculative", "junction"), [(False, 384), (True, 256)])
def test_with_mtp_a_shared_prefix_junction_is_one_block_earlier(speculative, junction):
    """Request 1 shares 400 tokens with request 0 (600 tokens, its state at 512, with MTP at 384): no state within
    the shared blocks, so it stops at the junction (3 blocks; 2 with MTP) to cache one there."""
    a = tokens("a", 600)
    first = request(0, 1, a + tokens("o", 10), 600, 10, chunk_size=1)
    second = request(2, 3, a[:400] + tokens("b", 210), 600, 10, chunk_size=1)
    pool = _pool(speculative)
    assert pool.admit(0, first, request_keys(first, 0, 128, 1), None, 0.0) == 0
    assert pool.prefill_stops(0) == checkpoints(600, 128, speculative)
    assert pool.admit(1, second, request_keys(second, 1, 128, 1), None, 0.0) == 0
    assert pool.prefill_stops(1) == (junction, *checkpoints(600, 128, speculative))


def test_progressive_names_nothing_hittable_before_its_chunk_is_scheduled():
    """Admission names request 0's blocks at 128 and 256 and its state at 256 ahead; another request with the same
    prompt hits that state only once request 0 has been scheduled past 256."""
    a = tokens("a", 300)
    same = [request(0, 1, a + tokens(f"o{i}", 10), 300, 10, chunk_size=1) for i in range(3)]
    keys = [request_keys(r, i, 128, 1) for i, r in enumerate(same)]
    pool = _pool(False, progressive=True)
    assert pool.admit(0, same[0], keys[0], None, 0.0, upto=300) == 0
    assert sorted(pool.depth[b] for b in pool.ahead) == [128, 256, 256]
    assert pool.admit(1, same[1], keys[1], None, 0.0, upto=300) == 0
    pool.progress(0, 200)
    assert sorted(pool.depth[b] for b in pool.ahead if pool.ahead[b] == 0) == [256, 256]
    pool.progress(0, 300)
    assert not [b for b in pool.ahead if pool.ahead[b] == 0]
    assert pool.admit(2, same[2], keys[2], None, 0.0, upto=300) == 256


def test_with_mtp_a_turn_end_resume_holds_every_block_before_its_point():
    """turn_end resume at 399 (turn 0's 300 + 100 - 1 computed tokens): the hit holds the three cached blocks before
    it and the partial block, whatever block the attention lookup drops for MTP."""
    pool = _pool(True, Resume())
    first, second = _turns("S")
    pool.admit(0, first, request_keys(first, 0, 128, 1), None, 0.0)
    pool.finish(0, first, 1.0)
    assert pool.admit(1, second, request_keys(second, 1, 128, 1), first, 2.0) == 399
    held = pool.running[1].attn[0]
    assert [pool.depth.get(b) for b in held[:3]] == [128, 256, 384] and all(pool.ref[b] for b in held)
