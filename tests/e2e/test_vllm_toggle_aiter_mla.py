"""aiter_mla in vLLM-CPU: off (the portable split-KV decode, `naive.latent_decode`, patched into CPU_MLA's
`forward_mqa`) against stock, which is on (CPU_MLA's `forward_mqa` calls vLLM-CPU's `mla_decode_kvcache`).

The count relation: K3's MLA layer (vllm/models/kimi_k3/nvidia/mla.py:693-715) runs, for every layer and step
with decode rows, the decode epilogue `fused_mla_decode_q_concat_kv_cache_insert` (counted by the CPU fix S2 as
"mla_decode_q_concat_cache_insert") exactly once and then `impl.forward_mqa` exactly once. So within a
generation, off calls the portable decode exactly as often as the epilogue (> 0), and stock never calls it.
"""

from __future__ import annotations

import pytest
from vllm_pool import random_prompts

from opts.aiter_mla import vllm as aiter_mla_vllm

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(16, seed=0)
STOCK, OFF = "cached", "aiter_mla_off"
DECODE_EPILOGUE = "mla_decode_q_concat_cache_insert"


def test_off_generates_the_stock_greedy_tokens(pool):
    stock = pool.generate(STOCK, PROMPTS, counted=True)
    off = pool.generate(OFF, PROMPTS, counted=True)
    assert off.tokens == stock.tokens


def test_off_runs_the_portable_decode_once_per_mla_decode_layer_step_and_stock_never(pool):
    stock = pool.generate(STOCK, PROMPTS, counted=True).counts
    off = pool.generate(OFF, PROMPTS, counted=True).counts
    print("stock:", stock, "\noff:", off)
    assert stock.get(aiter_mla_vllm.COUNTER, 0) == 0
    assert stock.get(DECODE_EPILOGUE, 0) > 0
    assert off.get(aiter_mla_vllm.COUNTER, 0) == off.get(DECODE_EPILOGUE, 0) > 0


def test_off_engine_installs_the_cpu_decode_patch_in_its_worker(pool):
    records = [r for r in pool.processes(OFF) if r["toggles"]]
    assert records, "no vLLM process of the aiter_mla_off engine recorded a toggle vector"
    for record in records:
        assert record["toggles"]["aiter_mla"]["mode"] == "off"
        ours = [p for p in record["patches"] if p["counter"] == aiter_mla_vllm.COUNTER]
        assert [p["target"] for p in ours] == [aiter_mla_vllm.CPU_DECODE], record
