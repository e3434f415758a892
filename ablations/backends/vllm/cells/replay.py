"""Sequential replay of a session trace through an in-process vLLM engine, one request at a time.

Every turn continues its session's previous turn token for token (previous prompt + its generated answer +
the new tool result), as a real agent does, so vLLM's prefix cache sees what a served agent would send.
Each request carries its session id and its trace time (seconds) to the scheduler in
`SamplingParams.extra_args` (`SESSION_KEY`, `TIME_KEY`), where cache_retention's session-aware pool reads them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ablations.backends.vllm.launch.engine import EngineConfig, open_llm
from ablations.workload.prompts import prompt_token_ids
from ablations.workload.trace import Trace, where
from opts.cache_retention.in_vllm import PARENT_KEY, SESSION_KEY, TIME_KEY

QUERIES_METRIC = "vllm:prefix_cache_queries"
HITS_METRIC = "vllm:prefix_cache_hits"


@dataclass(frozen=True)
class ReplayedRequest:
    """One replayed request: `request_id` is its index in the trace; times are seconds from the replay start."""

    request_id: int
    session: str | None
    turn: int | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    arrival_s: float
    finish_s: float


@dataclass(frozen=True)
class ReplayResult:
    """Per request in trace order: its record, prompt and output token ids; vLLM's prefix cache counters over
    the replay (tokens queried and hit)."""

    requests: tuple[ReplayedRequest, ...]
    prompts: list[list[int]]
    outputs: list[list[int]]
    prefix_cache_queries: int
    prefix_cache_hits: int

    def __post_init__(self) -> None:
        if not len(self.requests) == len(self.prompts) == len(self.outputs):
            raise ValueError(f"ReplayResult: {len(self.requests)} requests, {len(self.prompts)} prompts and "
                             f"{len(self.outputs)} outputs; valid: as many of each")

    @property
    def seconds(self) -> float:
        return self.requests[-1].finish_s if self.requests else 0.0

    @property
    def num_cached_tokens(self) -> list[int]:
        return [r.num_cached_tokens for r in self.requests]


def next_prompt(trace: Trace, prompts: Sequence[list[int]], outputs: Sequence[list[int]],
                vocab_size: int) -> list[int]:
    """The prompt of request `len(prompts)` of `trace`, given the prompts and outputs of the requests before it.

    Turn 0 (and a request without a session): its blocks' tokens. Turn n+1: turn n's prompt and output, then
    its own tokens past them; an input shorter than turn n's prompt and output is a ValueError.
    """
    index = len(prompts)
    if len(outputs) != index or not 0 <= index < len(trace.requests):
        raise ValueError(f"next_prompt: {index} prompts and {len(outputs)} outputs; valid: as many of each, "
                         f"fewer than the trace's {len(trace.requests)} requests")
    request = trace.requests[index]
    own = prompt_token_ids(request, trace.block_size, vocab_size)
    if request.session is None or request.turn == 0:
        return own
    previous = trace.sessions[request.session].request_ids[request.turn - 1]
    at = f"{where(trace.source, request.line)}session {request.session!r} turn {request.turn}"
    if previous >= index:
        raise ValueError(f"{at}: comes before turn {request.turn - 1} of its session; valid: turns in order")
    context = prompts[previous] + outputs[previous]
    if request.input_length < len(context):
        raise ValueError(f"{at}: input_length {request.input_length} is shorter than turn {request.turn - 1}'s "
                         f"prompt and output ({len(prompts[previous])} + {len(outputs[previous])} tokens)")
    return context + own[len(context):]


def counter_totals(llm: Any, names: Sequence[str]) -> dict[str, int]:
    """vLLM's Prometheus counters `names`, summed over their labels (a missing one is a RuntimeError)."""
    totals: dict[str, float] = {}
    for metric in llm.get_metrics():
        if metric.name in names and hasattr(metric, "value"):
            totals[metric.name] = totals.get(metric.name, 0.0) + float(metric.value)
    missing = [name for name in names if name not in totals]
    if missing:
        raise RuntimeError(f"vLLM reports no counter {', '.join(missing)} (engine started with log_stats off, or "
                           "this vLLM renamed it)")
    return {name: int(value) for name, value in totals.items()}


def replay(llm: Any, trace: Trace, vocab_size: int) -> ReplayResult:
    """Replay `trace` on the open `vllm.LLM` `llm` in trace order, one greedy request at a time."""
    from vllm import SamplingParams

    names = (QUERIES_METRIC, HITS_METRIC)
    before = counter_totals(llm, names)
    prompts: list[list[int]] = []
    outputs: list[list[int]] = []
    done: list[ReplayedRequest] = []
    start = time.monotonic()
    for index, request in enumerate(trace.requests):
        prompt = next_prompt(trace, prompts, outputs, vocab_size)
        params = SamplingParams(max_tokens=request.output_length, temperature=0.0, ignore_eos=True,
                                detokenize=False, extra_args={SESSION_KEY: request.session,
                                                              PARENT_KEY: request.parent_session,
                                                              TIME_KEY: request.timestamp_ms / 1000})
        arrival = time.monotonic() - start
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        finish = time.monotonic() - start
        output = list(out.outputs[0].token_ids)
        prompts.append(prompt)
        outputs.append(output)
        done.append(ReplayedRequest(index, request.session, request.turn, len(prompt), len(output),
                                    out.num_cached_tokens or 0, arrival, finish))
    after = counter_totals(llm, names)
    return ReplayResult(tuple(done), prompts, outputs, after[QUERIES_METRIC] - before[QUERIES_METRIC],
                        after[HITS_METRIC] - before[HITS_METRIC])


def replay_trace(cfg: EngineConfig, trace: Trace, vocab_size: int | None = None) -> ReplayResult:
    """Start an engine for `cfg`, replay `trace` on it (`vocab_size` None: the model's), shut it down."""
    for request in trace.requests:
        if request.input_length + request.output_length > cfg.max_model_len:
            raise ValueError(f"{where(trace.source, request.line)}session {request.session!r} turn {request.turn}: "
                             f"input_length {request.input_length} + output_length {request.output_length} exceed "
                             f"max_model_len {cfg.max_model_len}")
    with open_llm(cfg) as llm:
        return replay(llm, trace, cfg.model.vocab_size if vocab_size is None else vocab_size)
