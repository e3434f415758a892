"""fusion in vLLM-CPU: on (the fused passes of `opts.fusion.engine`, patched in by `opts.fusion.vllm`) against
stock "cached", which is off (vLLM's separate passes with the CPU fixes). No MTP: plain decode steps exist.

The count relation. Without speculation, K3's KDA layer (vllm/models/kimi_k3/nvidia/kda.py:904-1372) calls
`causal_conv1d_update` (CPU fix S8, counted "conv_update") and `fused_recurrent_kda_packed_decode` (S4,
"kda_packed_decode") once each per layer and plain decode step (no prefill rows), and neither in any other step
(prefill and mixed steps take the chunked path). On runs exactly those layer-steps as one fused pass and every
other step unchanged, so with F fused passes: F = off's kda_packed_decode = off's conv_update > 0, and on calls
each of the two F fewer times, i.e. never. K3's MLA layer calls `fused_q_kv_rmsnorm` (S15, "mla_q_kv_rmsnorm")
once per layer and step (mla.py:521); on replaces every call: fused norms = off's mla_q_kv_rmsnorm > 0 and on
calls S15 never. Greedy tokens are identical, so both engines schedule the same steps and every other counter
is equal.
"""

from __future__ import annotations

import pytest
from vllm_pool import random_prompts

from opts.fusion import vllm as fusion_vllm

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)
STOCK, ON = "cached", "fusion_on"
CONV, PACKED, NORMS = "conv_update", "kda_packed_decode", "mla_q_kv_rmsnorm"
FUSED_KDA, FUSED_NORM = fusion_vllm.KDA_COUNTER, fusion_vllm.MLA_COUNTER


def test_on_generates_the_stock_greedy_tokens(pool):
    stock = pool.generate(STOCK, PROMPTS, counted=True)
    on = pool.generate(ON, PROMPTS, counted=True)
    print(f"start s: {pool.start_seconds}; generate s: stock {stock.seconds:.1f}, on {on.seconds:.1f}")
    assert on.tokens == stock.tokens


def test_on_runs_one_fused_pass_per_plain_decode_layer_step_and_per_q_kv_norm(pool):
    off = pool.generate(STOCK, PROMPTS, counted=True).counts
    on = pool.generate(ON, PROMPTS, counted=True).counts
    print("off:", off, "\non:", on)
    assert off.get(FUSED_KDA, 0) == off.get(FUSED_NORM, 0) == 0
    fused = on.get(FUSED_KDA, 0)
    assert fused == off.get(PACKED, 0) == off.get(CONV, 0) > 0
    assert on.get(PACKED, 0) == off[PACKED] - fused == 0
    assert on.get(CONV, 0) == off[CONV] - fused == 0
    assert on.get(FUSED_NORM, 0) == off.get(NORMS, 0) > 0
    assert on.get(NORMS, 0) == 0
    changed = {CONV, PACKED, NORMS, FUSED_KDA, FUSED_NORM}
    assert {k: v for k, v in on.items() if k not in changed} == {k: v for k, v in off.items() if k not in changed}


def test_on_engine_installs_the_fused_passes_in_its_worker(pool):
    records = [r for r in pool.processes(ON) if r["toggles"]]
    assert records, "no vLLM process of the fusion_on engine recorded a toggle vector"
    expected = sorted([fusion_vllm.MLA_NORM_TARGET, fusion_vllm.KDA_FORWARD_TARGET, fusion_vllm.KDA_FUSED_TARGET])
    for record in records:
        assert record["toggles"]["fusion"]["mode"] == "on"
        ours = sorted(p["target"] for p in record["patches"] if p["why"].startswith("fusion on:"))
        assert ours == expected, record
