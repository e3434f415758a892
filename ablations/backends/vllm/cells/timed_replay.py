"""A timed replay of a workload through an open vLLM engine: requests added as their time comes, steps driven
here, per-request records for `ablations.metrics`.

The workload's schedule (`ablations.workload.schedule`: closed loop for sessions, timestamps otherwise) says
when each request may be sent; a session's next turn is its previous prompt and answer followed by its own
new tokens (as a served agent sends it), cut to `max_prompt_tokens`. Each request carries its session, its
parent session and its trace time in `SamplingParams.extra_args`, where cache_retention's session-aware pool
reads them. Times are seconds from the replay start on one monotonic clock.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablations.metrics import RequestRecord
from ablations.workload.prompts import prompt_token_ids
from ablations.workload.schedule import Schedule
from ablations.workload.trace import Trace
from opts.cache_retention.in_vllm import PARENT_KEY, SESSION_KEY, TIME_KEY

IDLE_SLEEP_S = 0.002


@dataclass(frozen=True)
class ReplayLimits:
    """Per-request caps that keep the tiny model inside its context: prompt and output tokens."""

    max_prompt_tokens: int
    max_tokens: int


def turn_prompt(trace: Trace, index: int, prompts: dict[int, list[int]], outputs: dict[int, list[int]],
                vocab_size: int, max_prompt_tokens: int) -> list[int]:
    """Request `index`'s prompt: its own blocks' tokens; a later turn of a session continues the previous
    turn's prompt and answer (which must have finished) and appends its own tokens past them."""
    request = trace.requests[index]
    own = prompt_token_ids(request, trace.block_size, vocab_size)
    if request.session is not None and request.turn:
        previous = trace.sessions[request.session].request_ids[request.turn - 1]
        if previous in outputs:
            context = prompts[previous] + outputs[previous]
            own = context + own[len(context):]
    return own[:max_prompt_tokens]


def timed_replay(llm: Any, trace: Trace, schedule: Schedule, vocab_size: int, limits: ReplayLimits, *,
                 progress: Callable[[int, int], None] | None = None) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Replay `trace` on the open `vllm.LLM` `llm` by `schedule`: (per-request records in trace order, what
    else was seen: output token ids per request and the replay's seconds). `progress(done, total)` is
    called as requests finish."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    total = len(trace.requests)
    ready: list[tuple[float, int]] = [(r.ready_s, r.request_id) for r in schedule.initial()]
    heapq.heapify(ready)
    prompts: dict[int, list[int]] = {}
    outputs: dict[int, list[int]] = {}
    arrival: dict[int, float] = {}
    first: dict[int, float] = {}
    records: dict[int, RequestRecord] = {}
    index_of: dict[str, int] = {}
    start = time.monotonic()
    while len(records) < total:
        now = time.monotonic() - start
        while ready and ready[0][0] <= now:
            _, i = heapq.heappop(ready)
            request = trace.requests[i]
            prompts[i] = turn_prompt(trace, i, prompts, outputs, vocab_size, limits.max_prompt_tokens)
            params = SamplingParams(max_tokens=min(request.output_length, limits.max_tokens), temperature=0.0,
                                    ignore_eos=True, detokenize=False,
                                    extra_args={SESSION_KEY: request.session, PARENT_KEY: request.parent_session,
                                                TIME_KEY: request.timestamp_ms / 1000})
            arrival[i] = time.monotonic() - start
            engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
            index_of[str(i)] = i    # outputs carry the id given here (the engine's own id adds a suffix)
        if not engine.has_unfinished_requests():
            if not ready:
                raise RuntimeError(f"timed_replay: {total - len(records)} request(s) never released by the schedule")
            time.sleep(min(max(ready[0][0] - (time.monotonic() - start), 0.0), IDLE_SLEEP_S * 50))
            continue
        for out in engine.step():
            i = index_of.get(out.request_id)
            if i is None:
                continue
            t = time.monotonic() - start
            tokens = list(out.outputs[0].token_ids)
            if tokens and i not in first:
                first[i] = t
            if out.finished:
                outputs[i] = tokens
                records[i] = RequestRecord(arrival[i], first.get(i, t), t, len(prompts[i]), max(1, len(tokens)),
                                           min(out.num_cached_tokens or 0, len(prompts[i])))
                for release in schedule.on_finish(i, t):
                    heapq.heappush(ready, (release.ready_s, release.request_id))
                if progress is not None:
                    progress(len(records), total)
    seconds = time.monotonic() - start
    return [records[i] for i in range(total)], {"outputs": [outputs[i] for i in range(total)], "seconds": seconds}
