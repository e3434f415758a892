"""Session replay prompts: each turn continues the previous one token for token; a fake engine for the loop."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from ablations.backends.vllm.cells.replay import (
    HITS_METRIC,
    QUERIES_METRIC,
    SESSION_KEY,
    ReplayResult,
    next_prompt,
    replay,
)
from ablations.workload.generate import generate
from ablations.workload.presets import AGENTX_SMALL
from ablations.workload.prompts import prompt_token_ids
from ablations.workload.trace import Request, Trace

VOCAB = 1024


def req(session, turn, length, hash_ids, output=3, parent=None, line=None):
    return Request(timestamp_ms=0.0, input_length=length, output_length=output, hash_ids=tuple(hash_ids),
                   session=session, turn=turn, parent_session=parent and parent[0],
                   parent_turn=parent and parent[1], line=line)


def small_trace():
    return Trace((
        req("a", 0, 6, [1, 2]),
        req("a", 1, 13, [1, 3, 4, 5], line=2),
        req("a.s", 0, 7, [1, 6], parent=("a", 0)),
        req("a.s", 1, 11, [1, 7, 8], parent=("a", 0)),
    ), block_size=4, source="t.jsonl")


def replay_prompts(trace, outputs):
    prompts = []
    for index in range(len(trace.requests)):
        prompts.append(next_prompt(trace, prompts, outputs[:index], VOCAB))
    return prompts


def test_turn_zero_is_its_own_blocks_and_a_later_turn_continues_the_last():
    trace = small_trace()
    outputs = [[900, 901, 902], [903, 904, 905], [906, 907, 908], [909, 910, 911]]
    prompts = replay_prompts(trace, outputs)
    assert prompts[0] == prompt_token_ids(trace.requests[0], 4, VOCAB)
    assert prompts[2] == prompt_token_ids(trace.requests[2], 4, VOCAB)
    context = prompts[0] + outputs[0]
    assert prompts[1] == context + prompt_token_ids(trace.requests[1], 4, VOCAB)[9:]
    assert prompts[3][:10] == prompts[2] + outputs[2]
    assert [len(p) for p in prompts] == [r.input_length for r in trace.requests]


def test_a_generated_session_trace_replays_as_continuations():
    trace = generate(replace(AGENTX_SMALL, num_sessions=2), seed=0)
    outputs = [[k + i % 7 for i in range(r.output_length)] for k, r in enumerate(trace.requests)]
    prompts = replay_prompts(trace, outputs)
    assert [len(p) for p in prompts] == [r.input_length for r in trace.requests]
    for session in trace.sessions.values():
        for before, after in zip(session.request_ids, session.request_ids[1:], strict=False):
            assert prompts[after][:len(prompts[before]) + len(outputs[before])] == prompts[before] + outputs[before]


def test_an_input_shorter_than_the_previous_turn_is_named():
    trace = small_trace()
    with pytest.raises(ValueError, match=r"t\.jsonl:2: session 'a' turn 1: input_length 13 is shorter"):
        next_prompt(trace, [[10] * 6], [[11] * 8], VOCAB)


def test_a_turn_before_its_previous_turn_is_an_error():
    trace = Trace((req("a", 1, 4, [2]), req("a", 0, 4, [1])), block_size=4)
    with pytest.raises(ValueError, match="session 'a' turn 1: comes before turn 0"):
        next_prompt(trace, [], [], VOCAB)


def test_prompts_and_outputs_must_match():
    with pytest.raises(ValueError, match="1 prompts and 0 outputs"):
        next_prompt(small_trace(), [[10]], [], VOCAB)


class FakeLLM:
    """Echoes `max_tokens` tokens, counts every prompt token as a query and reports 2 cached tokens each."""

    def __init__(self, metrics=(QUERIES_METRIC, HITS_METRIC)):
        self.names, self.queries, self.hits, self.params = metrics, 5, 1, []

    def generate(self, prompts, params, use_tqdm):
        (prompt,) = prompts
        self.params.append(params)
        self.queries += len(prompt["prompt_token_ids"])
        self.hits += 2
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[50] * params.max_tokens)], num_cached_tokens=2)]

    def get_metrics(self):
        values = {QUERIES_METRIC: self.queries, HITS_METRIC: self.hits}
        return [SimpleNamespace(name=name, value=values[name]) for name in self.names]


def test_replay_sends_one_greedy_request_per_turn_with_its_session(vllm):
    trace, llm = small_trace(), FakeLLM()
    result = replay(llm, trace, VOCAB)
    assert isinstance(result, ReplayResult) and result.prefix_cache_hits == 8
    assert result.prefix_cache_queries == sum(r.input_length for r in trace.requests)
    assert [p.extra_args[SESSION_KEY] for p in llm.params] == ["a", "a", "a.s", "a.s"]
    assert all(p.temperature == 0.0 and p.ignore_eos for p in llm.params)
    assert [(r.session, r.turn, r.num_output_tokens) for r in result.requests] == [
        ("a", 0, 3), ("a", 1, 3), ("a.s", 0, 3), ("a.s", 1, 3)]
    assert result.prompts[1][6:9] == [50, 50, 50] and result.num_cached_tokens == [2, 2, 2, 2]
    assert all(0 <= r.arrival_s <= r.finish_s for r in result.requests)


def test_replay_names_a_missing_counter(vllm):
    with pytest.raises(RuntimeError, match=HITS_METRIC):
        replay(FakeLLM(metrics=(QUERIES_METRIC,)), small_trace(), VOCAB)
