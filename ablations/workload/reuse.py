"""Theoretical prefix reuse of an unbounded cache with leading-block prefix matching (a prefix trie)."""

from __future__ import annotations

import numpy as np

from ablations.workload.trace import Trace


def served_blocks(trace: Trace) -> list[int]:
    """Per request (trace order): leading blocks served by a cache that holds every earlier prompt's blocks.

    Same result as `naive.served_blocks`, in one pass: a trie of every prompt seen so far, keyed by
    (parent node, hash id), so a block matches only if everything before it matched too.
    """
    children: dict[tuple[int, int], int] = {}
    served = [0] * len(trace.requests)
    for index in trace.arrival_order():
        node = 0
        hits = 0
        hash_ids = trace.requests[index].hash_ids
        for h in hash_ids:
            child = children.get((node, h))
            if child is None:
                break
            node = child
            hits += 1
        served[index] = hits
        for h in hash_ids[hits:]:
            child = len(children) + 1
            children[(node, h)] = child
            node = child
    return served


def reuse_summary(trace: Trace, served: list[int]) -> dict[str, float | np.ndarray]:
    """Trace-level reuse (blocks and tokens) and the per-request block reuse fractions."""
    block_size = trace.block_size
    blocks = np.array([len(r.hash_ids) for r in trace.requests], dtype=np.int64)
    hits = np.asarray(served, dtype=np.int64)
    inputs = np.array([r.input_length for r in trace.requests], dtype=np.int64)
    hit_tokens = np.minimum(hits * block_size, inputs)
    return {
        "block_fraction": float(hits.sum() / blocks.sum()),
        "token_fraction": float(hit_tokens.sum() / inputs.sum()),
        "per_request": hits / blocks,
    }
