"""Prompt token ids from a trace: one token block per hash id, shared wherever the hash id recurs."""

from __future__ import annotations

import pytest

from ablations.workload import Request
from ablations.workload.prompts import FIRST_TOKEN_ID, block_tokens, prompt_token_ids


def request(hash_ids, length):
    return Request(timestamp_ms=0.0, input_length=length, output_length=4, hash_ids=tuple(hash_ids))


def test_a_shared_prefix_is_the_same_tokens_and_a_new_block_is_not():
    a = prompt_token_ids(request([1, 2, 3], 40), 16, 1024)
    b = prompt_token_ids(request([1, 2, 4], 48), 16, 1024)
    assert len(a) == 40 and len(b) == 48
    assert a[:32] == b[:32] and a[32:40] != b[32:40]
    assert all(FIRST_TOKEN_ID <= t < 1024 for t in a + b)


def test_blocks_depend_on_hash_id_and_seed_only():
    assert block_tokens(7, 16, 1024) == block_tokens(7, 16, 1024)
    assert block_tokens(7, 16, 1024) != block_tokens(8, 16, 1024)
    assert block_tokens(7, 16, 1024, seed=1) != block_tokens(7, 16, 1024)


def test_prompts_are_cut_to_the_limit():
    full = prompt_token_ids(request(range(10), 150), 16, 1024)
    assert prompt_token_ids(request(range(10), 150), 16, 1024, max_tokens=50) == full[:50]


def test_a_vocabulary_without_room_for_tokens_is_an_error():
    with pytest.raises(ValueError, match="vocab_size: invalid value 8"):
        block_tokens(1, 16, 8)
