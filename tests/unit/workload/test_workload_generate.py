"""The generator: prefix structure of turns and sub-agents, determinism, and the presets' statistics."""

from __future__ import annotations

from collections import Counter

import pytest

from ablations.workload import LogNormal, Trace, generate, preset, trace_stats
from ablations.workload.io import check_block_sizes

K3_INPUT_P50 = 142_000
K3_INPUT_P90 = 550_000
K3_OUTPUT_MEAN = 800


def _by_key(trace: Trace) -> dict:
    return {(r.session, r.turn): r for r in trace.requests}


def _check_turns_extend(trace: Trace) -> int:
    """Turn n = turn n-1's full blocks, then blocks covering its answer and a new tool result."""
    block = trace.block_size
    by_key = _by_key(trace)
    checked = 0
    for session in trace.sessions.values():
        for turn in range(1, session.num_turns):
            before, after = by_key[session.session_id, turn - 1], by_key[session.session_id, turn]
            full = before.input_length // block
            assert after.hash_ids[:full] == before.hash_ids[:full]
            assert after.input_length > before.input_length + before.output_length
            assert set(after.hash_ids[full:]).isdisjoint(before.hash_ids)
            if before.input_length % block:
                assert before.hash_ids[-1] not in after.hash_ids  # a partial block is never shared
            checked += 1
    return checked


def _check_system_prompt_shared(trace: Trace, system_tokens: int) -> None:
    num_system = system_tokens // trace.block_size
    system = trace.requests[0].hash_ids[:num_system]
    assert all(r.hash_ids[:num_system] == system for r in trace.requests)
    firsts = [trace.requests[s.request_ids[0]] for s in trace.root_sessions]
    distinct = {r.hash_ids[num_system] for r in firsts}
    assert len(distinct) == len(firsts)  # right after the system prompt, sessions differ


def _check_subagents_share_prefix(trace: Trace, fork: str) -> int:
    block = trace.block_size
    by_key = _by_key(trace)
    count = 0
    for session in trace.sessions.values():
        if session.parent is None:
            continue
        parent_id, parent_turn = session.parent
        first = trace.requests[session.request_ids[0]]
        prefix = by_key[parent_id, 0 if fork == "first_prompt" else parent_turn]
        shared = prefix.input_length // block
        assert shared > 0
        assert first.hash_ids[:shared] == prefix.hash_ids[:shared]
        if fork == "spawn_point":
            context = (prefix.input_length + prefix.output_length) // block
            follower = by_key.get((parent_id, parent_turn + 1))
            if follower is not None:  # the parent's next turn holds the same answer blocks
                assert follower.hash_ids[:context] == first.hash_ids[:context]
            shared = context
        assert first.hash_ids[shared] not in prefix.hash_ids
        count += 1
    return count


@pytest.mark.parametrize("name", ["agentx_small", "agentx"])
def test_structure_of_generated_sessions(name, request):
    trace = request.getfixturevalue("small_trace" if name == "agentx_small" else "agentx_trace")
    config = preset(name)
    assert _check_turns_extend(trace) > 0
    _check_system_prompt_shared(trace, config.system_prompt_tokens)
    assert _check_subagents_share_prefix(trace, config.subagent_fork) > 0
    check_block_sizes(trace)
    partial = Counter(r.hash_ids[-1] for r in trace.requests if r.input_length % trace.block_size)
    assert max(partial.values()) == 1  # each partial last block is its request's own
    assert max(r.input_length + r.output_length for r in trace.requests) <= config.max_context_tokens


def test_subagents_forked_at_the_spawn_point_share_the_parent_context():
    config = preset("agentx_small").with_overrides(subagent_fork="spawn_point", subagent_probability=0.3)
    trace = generate(config, seed=1)
    assert _check_subagents_share_prefix(trace, "spawn_point") >= 5
    assert _check_turns_extend(trace) > 0


def test_generation_is_seeded_and_deterministic():
    config = preset("agentx_small")
    assert generate(config, seed=7).requests == generate(config, seed=7).requests
    assert generate(config, seed=7).requests != generate(config, seed=8).requests


def test_agentx_matches_the_published_k3_figures(agentx_trace):
    stats = trace_stats(agentx_trace)
    assert stats["input_len_p50"] == pytest.approx(K3_INPUT_P50, rel=0.10)
    assert stats["input_len_p90"] == pytest.approx(K3_INPUT_P90, rel=0.10)
    assert stats["output_len_mean"] == pytest.approx(K3_OUTPUT_MEAN, rel=0.10)
    assert stats["theoretical_prefix_reuse"] > 0.96
    assert stats["sessions"] == preset("agentx").num_sessions
    assert 30 * 60 <= stats["arrival_span_s"] <= 60 * 60  # nominal span at 50 tok/s/user


def test_agentx_small_fits_a_cpu_replay(small_trace):
    stats = trace_stats(small_trace)
    assert stats["theoretical_prefix_reuse"] > 0.96
    assert stats["sessions"] == 4
    assert stats["input_len_max"] + stats["output_len_max"] <= 4096 + 48
    assert 100 <= stats["requests"] <= 400
    assert stats["arrival_span_s"] <= 5 * 60


def test_agentx_with_another_seed_generates_and_analyses():
    stats = trace_stats(generate(preset("agentx"), seed=1))
    assert stats["sessions"] == preset("agentx").num_sessions
    assert stats["theoretical_prefix_reuse"] > 0.96


def test_generator_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"GeneratorConfig: unknown field\(s\) sessions; valid fields: "):
        preset("agentx").with_overrides(sessions=3)
    with pytest.raises(ValueError, match=r"GeneratorConfig.num_sessions: 0 is not an integer >= 1"):
        preset("agentx").with_overrides(num_sessions=0)
    with pytest.raises(ValueError, match=r"subagent_fork: invalid value 'x'; valid choices: first_prompt, spawn_point"):
        preset("agentx").with_overrides(subagent_fork="x")
    with pytest.raises(ValueError, match=r"max_context_tokens: 1800 cannot hold the longest first turn"):
        preset("agentx_small").with_overrides(max_context_tokens=1800)
    with pytest.raises(ValueError, match=r"LogNormal: need 0 <= low <= median <= high"):
        LogNormal(median=5, sigma=1, low=6, high=9)
    with pytest.raises(ValueError, match=r"preset: unknown name 'agentx_big'; valid choices: agentx, agentx_small"):
        preset("agentx_big")
