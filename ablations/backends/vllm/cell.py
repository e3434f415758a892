"""One run of the tiny model on vLLM with a toggle vector: start the engine, greedy-generate from the workload's
first requests, and report what ran: tokens, times, the kernel calls counted in every vLLM process and the
patches each process installed."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.backends.vllm.counters import COUNTER_DIR_ENV, read_counts
from ablations.backends.vllm.engine import engine_config, engine_kwargs, open_llm
from ablations.backends.vllm.toggles import read_records
from ablations.workload.prompts import prompt_token_ids
from ablations.workload.trace import Trace

log = logging.getLogger("ablations")
PROCESS_DIR = "vllm_processes"


def first_prompts(trace: Trace, backend: VllmBackendConfig, vocab_size: int) -> list[list[int]]:
    """Prompt token ids of the trace's first `num_requests` requests, each cut to `max_prompt_tokens`."""
    requests = trace.requests[: backend.num_requests]
    if not requests:
        raise ValueError(f"workload {trace.source or ''}: no requests to generate from")
    return [prompt_token_ids(r, trace.block_size, vocab_size, backend.max_prompt_tokens) for r in requests]


def run_cell(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any], trace: Trace, out_dir: Path,
             model_cache: str = "") -> dict[str, Any]:
    """Start the engine for `toggles`, generate, stop it; the cell's result. Every vLLM process writes its counts
    and patch record under `out_dir/vllm_processes`."""
    cfg = engine_config(backend, model, toggles, model_cache)
    prompts = first_prompts(trace, backend, model.vocab_size)
    process_dir = out_dir / PROCESS_DIR
    previous = os.environ.get(COUNTER_DIR_ENV)
    os.environ[COUNTER_DIR_ENV] = str(process_dir)
    try:
        log.info("vllm: starting %s engine (%s) with toggles %s", model.name, backend.platform, cfg.toggles)
        t0 = time.perf_counter()
        with open_llm(cfg) as llm:
            start_s = time.perf_counter() - t0
            log.info("vllm: engine up in %.1f s; generating %d requests x %d tokens", start_s, len(prompts),
                     backend.max_tokens)
            from vllm import SamplingParams

            params = SamplingParams(max_tokens=backend.max_tokens, temperature=0.0, ignore_eos=True,
                                    detokenize=False)
            t1 = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            generate_s = time.perf_counter() - t1
    finally:
        if previous is None:
            os.environ.pop(COUNTER_DIR_ENV, None)
        else:
            os.environ[COUNTER_DIR_ENV] = previous
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    num_output = sum(map(len, tokens))
    log.info("vllm: %d output tokens in %.2f s (%.1f tokens/s)", num_output, generate_s, num_output / generate_s)
    kwargs = engine_kwargs(cfg)
    return {
        "toggles": cfg.toggles,
        "platform": backend.platform,
        "engine_args": {k: v for k, v in kwargs.items() if k != "model"},
        "env": {name: setting.env for name, setting in cfg.settings().items() if setting.env},
        "num_requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "output_tokens": num_output,
        "engine_start_s": start_s,
        "generate_s": generate_s,
        "output_tokens_per_s": num_output / generate_s,
        "output_token_ids": tokens,
        "kernel_counts": read_counts(process_dir),
        "processes": read_records(process_dir),
    }
