"""fusion in vLLM-CPU: off (`naive.py`'s separate compiled passes) against on (`passes.py`'s fused ones), both
patched in by `opts.fusion.vllm` (on a CPU neither is stock: stock runs these steps eagerly), and both against
stock "cached" (its generation shared with test_vllm_toggle_aiter_mla.py). No MTP: plain decode steps exist.

The count relation. Without speculation, K3's KDA layer (vllm/models/kimi_k3/nvidia/kda.py:904-1372) calls
`causal_conv1d_update` (CPU fix S8, "conv_update") and `fused_recurrent_kda_packed_decode` (S4,
"kda_packed_decode") once each per layer and plain decode step (no prefill rows), and neither in any other step
(prefill and mixed steps take the chunked path). Off and on both run exactly those layer-steps through their
patch (off: "fusion_kda_decode_unfused", three compiled passes; on: "fusion_kda_decode_fused", one) and every
other step unchanged, so with F = stock's S8 calls = stock's S4 calls > 0: off's unfused count = on's fused
count = F, and neither calls S8 or S4. K3's MLA layer calls `fused_q_kv_rmsnorm` once per layer and step
(mla.py:521): stock runs S15 ("mla_q_kv_rmsnorm") there, off and on replace it, so off's unfused norms = on's
fused norms = stock's S15 calls > 0 and neither calls S15. Greedy tokens are identical, so all three engines
schedule the same steps and every other counter is equal.
"""

from __future__ import annotations

import pytest
from vllm_pool import random_prompts

from opts.fusion import FusionConfig
from opts.fusion import vllm as fusion_vllm

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)
STOCK, OFF, ON = "cached", "fusion_off", "fusion_on"
MODES = {OFF: "off", ON: "on"}
BYPASSED = ("conv_update", "kda_packed_decode", "mla_q_kv_rmsnorm")    # S8, S4, S15: neither mode calls them
KDA = {OFF: fusion_vllm.KDA_UNFUSED_COUNTER, ON: fusion_vllm.KDA_COUNTER}
NORM = {OFF: fusion_vllm.MLA_UNFUSED_COUNTER, ON: fusion_vllm.MLA_COUNTER}


def test_off_and_on_generate_the_stock_greedy_tokens(pool):
    stock = pool.generate(STOCK, PROMPTS, counted=True)
    off = pool.generate(OFF, PROMPTS, counted=True)
    on = pool.generate(ON, PROMPTS, counted=True)
    print(f"start s: {pool.start_seconds}; generate s: stock {stock.seconds:.1f}, off {off.seconds:.1f}, "
          f"on {on.seconds:.1f}")
    assert off.tokens == stock.tokens
    assert on.tokens == stock.tokens


def test_off_and_on_run_stocks_plain_decode_steps_and_q_kv_norms_unfused_and_fused(pool):
    stock = pool.generate(STOCK, PROMPTS, counted=True).counts
    off = pool.generate(OFF, PROMPTS, counted=True).counts
    on = pool.generate(ON, PROMPTS, counted=True).counts
    print("stock:", stock, "\noff:", off, "\non:", on)
    decode_steps = stock.get("conv_update", 0)
    assert off.get(KDA[OFF], 0) == on.get(KDA[ON], 0) == decode_steps == stock.get("kda_packed_decode", 0) > 0
    assert off.get(NORM[OFF], 0) == on.get(NORM[ON], 0) == stock.get("mla_q_kv_rmsnorm", 0) > 0
    assert off.get(KDA[ON], 0) == off.get(NORM[ON], 0) == on.get(KDA[OFF], 0) == on.get(NORM[OFF], 0) == 0
    for name in BYPASSED:
        assert off.get(name, 0) == on.get(name, 0) == 0, name
    changed = {*BYPASSED, *KDA.values(), *NORM.values()}
    rest = {k: v for k, v in stock.items() if k not in changed}
    assert rest and {k: v for k, v in off.items() if k not in changed} == rest
    assert {k: v for k, v in on.items() if k not in changed} == rest


@pytest.mark.parametrize("engine", [OFF, ON])
def test_each_worker_installs_exactly_its_settings_patches(pool, engine):
    """Each process serving the vector (the worker, and the EngineCore where the scheduler installs it too)
    carries, after the CPU fixes and the toggle hooks, exactly the patches of its fusion setting, in order."""
    expected = [(p.target, p.why) for p in fusion_vllm.vllm_setting(FusionConfig(mode=MODES[engine]), "cpu").patches]
    records = pool.processes(engine)
    serving = [r for r in records if r["toggles"]]
    assert serving, f"the {engine} engine recorded no process serving its vector: {records}"
    for record in serving:
        assert record["toggles"]["fusion"]["mode"] == MODES[engine]
        pairs = [(p["target"], p["why"]) for p in record["patches"]]
        assert pairs[-len(expected):] == expected, record
        assert not set(pairs[:-len(expected)]) & set(expected), record
