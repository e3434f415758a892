"""Every kernel the plugin replaces is actually called in the e2e runs (counts from every vLLM process the
pool started). Each of the stock engines that together call them all generates here unless it already did in
this run (then its counts are on disk and starting it again would add nothing)."""

from __future__ import annotations

import pytest
from vllm_pool import random_prompts

from ablations.backends.vllm.in_vllm.cpu import REPLACED_KERNELS

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)


def test_every_replaced_kernel_was_called(pool):
    for engine in ("base", "cached", "mtp"):
        if not pool.ran(engine):
            pool.generate(engine, PROMPTS)
    if not any(key[0] == "mtp" and key[3] > 0 for key in pool.cache):     # MTP with random sampling
        pool.generate("mtp", PROMPTS[:4], temperature=1.0)
    pool.close()
    counts = pool.total_counts()
    print("replaced-kernel calls:", counts)
    missing = [name for name in REPLACED_KERNELS if counts.get(name, 0) == 0]
    assert not missing, f"replaced kernels never called: {missing}; counts {counts}"
