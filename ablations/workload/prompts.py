"""Prompt token ids for a trace's requests: each hash id names one block of tokens, the same block wherever
it appears, so requests that share a prefix in the trace share it token for token (and hit a prefix cache)."""

from __future__ import annotations

import numpy as np

from ablations.workload.trace import Request

FIRST_TOKEN_ID = 10   # ids below this are left to special tokens


def block_tokens(hash_id: int, block_size: int, vocab_size: int, seed: int = 0) -> list[int]:
    """The `block_size` token ids of block `hash_id` (deterministic in hash_id, seed and vocab_size)."""
    if vocab_size <= FIRST_TOKEN_ID:
        raise ValueError(f"vocab_size: invalid value {vocab_size}; valid: > {FIRST_TOKEN_ID}")
    rng = np.random.default_rng([seed, hash_id])
    return rng.integers(FIRST_TOKEN_ID, vocab_size, size=block_size).tolist()


def prompt_token_ids(request: Request, block_size: int, vocab_size: int, max_tokens: int | None = None,
                     seed: int = 0) -> list[int]:
    """The request's prompt: its blocks' tokens, `input_length` long, cut to the first `max_tokens` if given."""
    length = request.input_length if max_tokens is None else min(request.input_length, max_tokens)
    ids: list[int] = []
    for hash_id in request.hash_ids:
        if len(ids) >= length:
            break
        ids += block_tokens(hash_id, block_size, vocab_size, seed)
    return ids[:length]
