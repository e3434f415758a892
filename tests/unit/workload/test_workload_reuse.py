"""Theoretical prefix reuse: the trie against the quadratic definition, hand-computed cases, the real traces."""

from __future__ import annotations

import numpy as np
import pytest
from workload_helpers import CONVERSATION, SYNTHETIC, request

from ablations.workload import Trace, naive, read_trace, reuse, trace_stats
from ablations.workload.reuse import reuse_summary


def _random_trace(rng: np.random.Generator, num_requests: int, block_size: int) -> Trace:
    """Prompts that fork from earlier prompts at random points, in shuffled timestamp order."""
    prompts: list[list[int]] = []
    next_id = 0
    requests = []
    for i in range(num_requests):
        base = prompts[rng.integers(len(prompts))] if prompts and rng.random() < 0.8 else []
        keep = int(rng.integers(0, len(base) + 1))
        fresh = int(rng.integers(1, 6))
        ids = base[:keep] + list(range(next_id, next_id + fresh))
        next_id += fresh
        prompts.append(ids)
        length = (len(ids) - 1) * block_size + int(rng.integers(1, block_size + 1))
        requests.append(request(f"r{i}", 0, length, ids, ts=float(rng.integers(0, 50))))
    return Trace(tuple(requests), block_size)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trie_matches_the_definition_on_random_traces(seed):
    trace = _random_trace(np.random.default_rng(seed), 300, 8)
    assert reuse.served_blocks(trace) == naive.served_blocks(trace)


@pytest.mark.parametrize("path", [CONVERSATION, SYNTHETIC])
def test_trie_matches_the_definition_on_real_trace_slices(path):
    full = read_trace(path)
    part = Trace(full.requests[:1500], full.block_size)
    assert reuse.served_blocks(part) == naive.served_blocks(part)


def test_hand_computed_first_rows_of_the_conversation_trace():
    full = read_trace(CONVERSATION)
    part = Trace(full.requests[:6], full.block_size)
    # rows 1-6 have 14, 15, 15, 5, 14, 10 blocks and all start with block 0, the only id they share
    assert reuse.served_blocks(part) == [0, 1, 1, 1, 1, 1]
    summary = reuse_summary(part, reuse.served_blocks(part))
    assert summary["block_fraction"] == pytest.approx(5 / 73, abs=1e-12)
    assert summary["token_fraction"] == pytest.approx(5 * 512 / (6758 + 7322 + 7236 + 2290 + 6760 + 4834), abs=1e-12)


def test_hand_computed_prefix_matching_and_arrival_order():
    # block size 4; c is third in the file but arrives first, so it serves a's first block
    a = request("a", 0, 12, [1, 2, 3], ts=10)
    b = request("b", 0, 16, [1, 2, 9, 4], ts=20)
    c = request("c", 0, 8, [1, 7], ts=0)
    d = request("d", 0, 12, [5, 2, 3], ts=30)  # block 2 equals a's, but its first block does not: no hit
    trace = Trace((a, b, c, d), block_size=4)
    assert reuse.served_blocks(trace) == [1, 2, 0, 0]
    stats = trace_stats(trace)
    assert stats["theoretical_prefix_reuse"] == pytest.approx(3 / 12)
    assert stats["theoretical_prefix_reuse_tokens"] == pytest.approx(12 / 48)
    assert stats["request_reuse_p50"] == pytest.approx((0 + 1 / 3) / 2)


@pytest.mark.parametrize(
    ("path", "requests", "block_reuse", "token_reuse"),
    [(CONVERSATION, 12031, 0.3664124783362218, 0.3736237491291324),
     (SYNTHETIC, 3993, 0.6396038629109676, 0.6512444360312151)],
)
def test_real_trace_statistics(path, requests, block_reuse, token_reuse):
    stats = trace_stats(read_trace(path))
    assert stats["requests"] == requests
    assert stats["sessions"] is None
    assert stats["theoretical_prefix_reuse"] == pytest.approx(block_reuse, abs=1e-12)
    assert stats["theoretical_prefix_reuse_tokens"] == pytest.approx(token_reuse, abs=1e-12)
    assert sum(stats["request_reuse_histogram"].values()) == requests
