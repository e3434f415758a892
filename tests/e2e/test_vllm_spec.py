"""MTP speculative decoding (K=2) with prefix caching and chunked prefill: lossless, and its KDA state handling."""

from __future__ import annotations

import pytest
from vllm_pool import MAX_TOKENS, random_prompts

from ablations.backends.vllm.in_vllm.cpu.kda import MIXED_STEP_COUNTER

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)
K = 2


def test_mtp_matches_non_speculative(pool):
    assert pool.generate("mtp", PROMPTS).tokens == pool.generate("base", PROMPTS).tokens


def test_mtp_drafts_are_verified(pool):
    drafts_before = pool.metric("mtp", "vllm:spec_decode_num_draft_tokens")
    pool.generate("mtp", PROMPTS[:4], key="drafts")
    drafts = pool.metric("mtp", "vllm:spec_decode_num_draft_tokens") - drafts_before
    accepted = pool.metric("mtp", "vllm:spec_decode_num_accepted_tokens")
    print(f"MTP draft tokens {drafts:.0f}, accepted so far {accepted:.0f} (random weights: acceptance ~0)")
    assert drafts >= 4 * (MAX_TOKENS - 1)


def test_mtp_steps_mix_prefill_chunks_with_verification(pool):
    assert pool.generate("mtp", PROMPTS, counted=True).counts.get(MIXED_STEP_COUNTER, 0) > 0


def test_mtp_random_sampling_runs(pool):
    gen = pool.generate("mtp", PROMPTS[:4], temperature=1.0)
    assert all(len(out) == MAX_TOKENS for out in gen.tokens)


def test_accepted_drafts_leave_the_right_kda_state(pool):
    """Synthetic acceptance (every draft accepted): each step emits K drafts then the target's own token.

    The target's tokens (positions 0, K+1, 2(K+1), ...) must equal what the non-speculative engine
    predicts from the same prefix in one shot: this holds only if the KDA conv and recurrent states,
    and their block copies under prefix caching, are right after multi-token acceptance.
    """
    prompts = PROMPTS[:6]
    spec = pool.generate("mtp_synthetic", prompts).tokens
    positions = list(range(0, MAX_TOKENS, K + 1))
    prefixes = [p + out[:i] for p, out in zip(prompts, spec, strict=True) for i in positions]
    one_shot = pool.generate("base", prefixes, max_tokens=1)
    expected = [out[i] for out in spec for i in positions]
    assert [t[0] for t in one_shot.tokens] == expected
