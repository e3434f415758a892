"""A trace as the prefix cache sees it (`opts.k3.cache.stream.CacheStream`): times, content ids, turns.

Times come from a replay with no queueing at nominal prefill and decode rates (`nominal_times`), closed-loop for
a session trace, so a turn never starts before the turn it continues has finished. A session's turn continues
the previous one when its prompt holds the previous prompt's full blocks and is at least as long as that
prompt and its answer (the generator's sessions always do): the previous turn's tokens, answer included, are
then named by the next turn's hash ids, as they are the same tokens.

`cache_scenarios` hands cache_retention its built-in sweep scenarios (the workload presets and the vendored
Mooncake traces) through the entry-point group `k3_ablate.cache_scenarios` (pyproject.toml): `opts` never
imports this layer.
"""

from __future__ import annotations

from functools import partial

from ablations.workload.generate import generate
from ablations.workload.io import read_trace
from ablations.workload.paths import TRACES
from ablations.workload.presets import preset
from ablations.workload.schedule import ClosedLoopSchedule, OpenLoopSchedule, simulate
from ablations.workload.trace import Request, Trace
from opts.cache_retention.bench.sweep import Scenario
from opts.k3.cache.geometry import K3_TP8, TINY
from opts.k3.cache.stream import CacheRequest, CacheStream

QUICK_CONVERSATION_REQUESTS = 1000


def continues(previous: Request, request: Request, block_size: int) -> bool:
    """Whether `request`'s prompt starts with `previous`'s prompt and answer."""
    full = previous.input_length // block_size
    return (request.input_length >= previous.input_length + previous.output_length
            and request.hash_ids[:full] == previous.hash_ids[:full])


def nominal_times(trace: Trace, previous_of: dict[int, int], prefill_tok_s: float,
                  decode_tok_s: float) -> list[tuple[float, float]]:
    """(arrival, finish) per request: a session trace replayed closed-loop (a turn released its think time after
    what it waits for finished), each request served in its new prompt tokens (past the turn it continues) at
    `prefill_tok_s` and its output at `decode_tok_s`, as the generator stamps its timestamps; a trace without
    sessions at its timestamps, the whole prompt prefilled."""
    requests = trace.requests

    def service_s(i: int) -> float:
        before = previous_of.get(i)
        new = requests[i].input_length - (requests[before].input_length if before is not None else 0)
        return new / prefill_tok_s + requests[i].output_length / decode_tok_s

    schedule = ClosedLoopSchedule(trace) if trace.has_sessions else OpenLoopSchedule(trace)
    return [(ready, finish) for ready, finish in simulate(schedule, service_s)]


def continuations(trace: Trace) -> tuple[dict[int, int], list[tuple[int, ...]]]:
    """(for each request that continues an earlier turn of its session, that turn's index; every request's chunk
    ids, a continued turn's extended over its answer by the ids of the turn that continues it)."""
    requests = trace.requests
    previous_of: dict[int, int] = {}
    for session in trace.sessions.values():
        for before, after in zip(session.request_ids, session.request_ids[1:], strict=False):
            if continues(requests[before], requests[after], trace.block_size):
                previous_of[after] = before
    ids = [r.hash_ids for r in requests]
    for after in sorted(previous_of, key=lambda i: -(requests[i].turn or 0)):
        before = previous_of[after]
        r = requests[before]
        ids[before] = ids[after][:-(-(r.input_length + r.output_length) // trace.block_size)]
    return previous_of, ids


def cache_stream(trace: Trace, *, prefill_tok_s: float = 20_000.0, decode_tok_s: float = 50.0,
                 times: list[tuple[float, float]] | None = None) -> CacheStream:
    """The trace's requests in arrival order; `times` (arrival, finish) per trace request overrides the
    nominal ones (e.g. from a replay through vLLM)."""
    for name, value in (("prefill_tok_s", prefill_tok_s), ("decode_tok_s", decode_tok_s)):
        if not value > 0:
            raise ValueError(f"{name}: invalid value {value!r}; valid: tokens per second > 0")
    requests = trace.requests
    previous_of, ids = continuations(trace)
    if times is None:
        times = nominal_times(trace, previous_of, prefill_tok_s, decode_tok_s)
    elif len(times) != len(requests):
        raise ValueError(f"times: {len(times)} entries for {len(requests)} requests")
    order = sorted(range(len(requests)), key=lambda i: (times[i][0], i))
    position = {i: k for k, i in enumerate(order)}
    stream = []
    for i in order:
        r = requests[i]
        before = previous_of.get(i)
        stream.append(CacheRequest(
            arrival_s=times[i][0], finish_s=times[i][1], num_prompt_tokens=r.input_length,
            num_output_tokens=r.output_length, chunk_ids=tuple(ids[i]), session=r.session,
            continues=None if before is None else position[before], parent=r.parent_session))
    return CacheStream(tuple(stream), trace.block_size, trace.source)


def preset_stream(name: str, seed: int = 0) -> CacheStream:
    """The cache stream of workload preset `name` generated with `seed`."""
    return cache_stream(generate(preset(name), seed=seed))


def file_stream(path: str, num_requests: int | None = None) -> CacheStream:
    """The cache stream of a trace file (`pkg://` paths resolve in the package), cut to its first
    `num_requests` requests when given."""
    trace = read_trace(path)
    if num_requests is not None:
        if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
            raise ValueError(f"num_requests: invalid value {num_requests!r}; valid: an integer >= 1 or None")
        trace = Trace(trace.requests[:num_requests], trace.block_size, trace.source)
    return cache_stream(trace)


def cache_scenarios() -> dict[str, Scenario]:
    """cache_retention's built-in sweep scenarios: the agentx presets and the Mooncake traces at K3's TP8
    geometry (agentx_small at the tiny model's); the quick bench runs agentx_small and the conversation
    trace's first QUICK_CONVERSATION_REQUESTS requests."""
    conversation = f"{TRACES}/conversation_trace.jsonl.gz"
    cut = f"mooncake_conversation_{QUICK_CONVERSATION_REQUESTS}"
    found = [
        Scenario("agentx", partial(preset_stream, "agentx"), K3_TP8),
        Scenario("agentx_small", partial(preset_stream, "agentx_small"), TINY, quick=True),
        Scenario("mooncake_conversation", partial(file_stream, conversation), K3_TP8),
        Scenario("mooncake_synthetic", partial(file_stream, f"{TRACES}/synthetic_trace.jsonl.gz"), K3_TP8),
        Scenario(cut, partial(file_stream, conversation, QUICK_CONVERSATION_REQUESTS), K3_TP8, quick=True,
                 full=False),
    ]
    return {s.name: s for s in found}
