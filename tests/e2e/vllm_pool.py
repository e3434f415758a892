"""Shared engines for the vLLM e2e tests: at most one engine alive at a time, results memoized.

Engines are heavy (about 2 GB and 20-40 s to start on 2 cores), so tests ask the pool for
*results* of a named engine; the pool starts that engine (stopping the previous one) only when
a result is not cached yet. Tests that compare two engines thus never hold both.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.engine import EngineConfig, build_llm, shutdown_llm

MODEL = ModelConfig(dtype="float32")
MAX_TOKENS = 16
# Chunked prefill with a small token budget: steps mix prefill chunks with decodes (and, with MTP,
# with verification rows); a 128-token cache block takes 2+ chunks.
SMALL_BUDGET = 64

ENGINES: dict[str, EngineConfig] = {
    "base": EngineConfig(model=MODEL, skip_tokenizer_init=True),
    "cached": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET
    ),
    "mtp": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET,
        num_speculative_tokens=2,
    ),
    "mtp_synthetic": EngineConfig(
        model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=True, max_num_batched_tokens=SMALL_BUDGET,
        num_speculative_tokens=2, rejection_sample_method="synthetic", synthetic_acceptance_rates=[1.0, 1.0],
    ),
}


def random_prompts(num: int, seed: int, min_len: int = 20, max_len: int = 300, vocab: int = 1000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randrange(min_len, max_len))] for _ in range(num)]


@dataclass
class Generation:
    tokens: list[list[int]]
    num_cached_tokens: list[int]
    seconds: float


@dataclass
class EnginePool:
    current: str | None = None
    llm: Any = None
    start_seconds: dict[str, float] = field(default_factory=dict)
    cache: dict[tuple, Generation] = field(default_factory=dict)

    def engine(self, name: str) -> Any:
        if self.current != name:
            self.close()
            t0 = time.perf_counter()
            self.llm = build_llm(ENGINES[name])
            self.start_seconds[name] = time.perf_counter() - t0
            self.current = name
        return self.llm

    def generate(
        self, name: str, prompts: list[list[int]], max_tokens: int = MAX_TOKENS, temperature: float = 0.0,
        one_by_one: bool = False, key: str = "",
    ) -> Generation:
        """Greedy (by default) token ids for `prompts` on engine `name`; memoized by all arguments."""
        cache_key = (name, tuple(map(tuple, prompts)), max_tokens, temperature, one_by_one, key)
        if cache_key not in self.cache:
            llm = self.engine(name)
            from vllm import SamplingParams

            params = SamplingParams(
                max_tokens=max_tokens, temperature=temperature, ignore_eos=True, detokenize=False
            )
            batches = [[p] for p in prompts] if one_by_one else [prompts]
            t0 = time.perf_counter()
            outputs = [
                out
                for batch in batches
                for out in llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
            ]
            self.cache[cache_key] = Generation(
                [list(o.outputs[0].token_ids) for o in outputs],
                [o.num_cached_tokens or 0 for o in outputs],
                time.perf_counter() - t0,
            )
        return self.cache[cache_key]

    def metric(self, name: str, metric: str) -> float:
        """Sum of vLLM's own Prometheus counter `metric` on engine `name` (starting it if needed: read
        it before and after an uncached `generate` to get that run's count)."""
        total = 0.0
        for m in self.engine(name).get_metrics():
            if m.name == metric and hasattr(m, "value"):
                total += float(m.value)
        return total

    def close(self) -> None:
        if self.llm is not None:
            shutdown_llm(self.llm)
            self.llm = None
            self.current = None
