"""Closed- and open-loop schedules: release times by hand, sub-agent joins, concurrency caps, misuse."""

from __future__ import annotations

import pytest
from workload_helpers import request

from ablations.workload import (
    ClosedLoopSchedule,
    OpenLoopSchedule,
    Release,
    Trace,
    TraceError,
    preset,
    simulate,
)


def _agent_trace() -> Trace:
    # a: 3 turns from t=1 s; a/0 spawns sub-agents b (2 turns) and c (1 turn); e: one turn at t=0
    rows = (
        request("e", 0, 4, [90], ts=0),
        request("a", 0, 4, [1], ts=1000),
        request("b", 0, 8, [1, 2], think_ms=200, parent=("a", 0)),
        request("c", 0, 8, [1, 3], think_ms=300, parent=("a", 0)),
        request("b", 1, 12, [1, 2, 4], think_ms=100, parent=("a", 0)),
        request("a", 1, 8, [1, 5], think_ms=500),
        request("a", 2, 12, [1, 5, 6], think_ms=0),
    )
    return Trace(rows, block_size=4)


def test_closed_loop_release_times_by_hand():
    trace = _agent_trace()
    ids = {(r.session, r.turn): i for i, r in enumerate(trace.requests)}
    s = ClosedLoopSchedule(trace)
    assert sorted(s.initial()) == [Release(0.0, ids["e", 0]), Release(1.0, ids["a", 0])]
    assert s.on_finish(ids["e", 0], 0.4) == []
    assert sorted(s.on_finish(ids["a", 0], 2.0)) == [Release(2.2, ids["b", 0]), Release(2.3, ids["c", 0])]
    assert s.on_finish(ids["b", 0], 3.0) == [Release(pytest.approx(3.1), ids["b", 1])]
    assert s.on_finish(ids["c", 0], 2.5) == []  # a/1 still waits for b's last turn
    assert s.on_finish(ids["b", 1], 4.0) == [Release(4.5, ids["a", 1])]
    assert s.on_finish(ids["a", 1], 5.0) == [Release(5.0, ids["a", 2])]
    assert not s.is_done
    assert s.on_finish(ids["a", 2], 6.0) == []
    assert s.is_done


def test_closed_loop_start_at_zero_and_session_cap():
    trace = _agent_trace()
    ids = {(r.session, r.turn): i for i, r in enumerate(trace.requests)}
    assert sorted(ClosedLoopSchedule(trace, start="zero").initial()) == [Release(0.0, ids["e", 0]),
                                                                         Release(0.0, ids["a", 0])]
    capped = ClosedLoopSchedule(trace, max_live_sessions=1)
    assert capped.initial() == [Release(0.0, ids["e", 0])]
    assert capped.on_finish(ids["e", 0], 3.0) == [Release(3.0, ids["a", 0])]  # a starts when e completes
    capped = ClosedLoopSchedule(trace, max_live_sessions=1)
    capped.initial()
    assert capped.on_finish(ids["e", 0], 0.5) == [Release(1.0, ids["a", 0])]  # ... but not before its own start


def test_closed_loop_session_cap_counts_sub_agents_as_part_of_their_root():
    trace = Trace((*_agent_trace().requests, request("f", 0, 4, [70], ts=0)), block_size=4)
    ids = {(r.session, r.turn): i for i, r in enumerate(trace.requests)}
    times = simulate(ClosedLoopSchedule(trace, start="zero", max_live_sessions=1), lambda i: 1.0)
    # e [0, 1]; a/0 [1, 2]; b/0 [2.2, 3.2], c/0 [2.3, 3.3]; b/1 [3.3, 4.3]; a/1 [4.8, 5.8]; a/2 [5.8, 6.8]
    assert times[ids["e", 0]] == (0.0, 1.0)
    assert times[ids["a", 0]] == (1.0, 2.0)
    assert times[ids["b", 1]] == pytest.approx((3.3, 4.3))
    assert times[ids["a", 2]] == pytest.approx((5.8, 6.8))
    assert times[ids["f", 0]] == pytest.approx((6.8, 7.8))  # only when a and its sub-agents are all done


def test_closed_loop_misuse_is_an_error():
    trace = _agent_trace()
    ids = {(r.session, r.turn): i for i, r in enumerate(trace.requests)}
    s = ClosedLoopSchedule(trace)
    s.initial()
    with pytest.raises(ValueError, match=r"initial\(\) was already called"):
        s.initial()
    with pytest.raises(ValueError, match=f"request_id: {ids['a', 1]} finished but was never released"):
        s.on_finish(ids["a", 1], 9.0)
    with pytest.raises(ValueError, match=r"is before its release at 1.0 s"):
        s.on_finish(ids["a", 0], 0.5)
    s.on_finish(ids["a", 0], 2.0)
    with pytest.raises(ValueError, match=r"finished twice"):
        s.on_finish(ids["a", 0], 2.0)
    with pytest.raises(ValueError, match=r"not a request of this trace"):
        s.on_finish(99, 2.0)
    with pytest.raises(ValueError, match=r"start: invalid value 'now'; valid choices: trace, zero"):
        ClosedLoopSchedule(trace, start="now")
    with pytest.raises(ValueError, match=r"max_live_sessions: 0 is not an integer >= 1"):
        ClosedLoopSchedule(trace, max_live_sessions=0)


def test_closed_loop_needs_sessions():
    trace = Trace((request("x", 0, 4, [1]),), block_size=4)
    plain = Trace(tuple(r.__class__(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids)
                        for r in trace.requests), block_size=4, source="plain.jsonl")
    with pytest.raises(TraceError, match=r"plain.jsonl: a closed-loop schedule needs sessions"):
        ClosedLoopSchedule(plain)


def test_open_loop_releases_everything_at_its_timestamp():
    trace = Trace((request("a", 0, 4, [1], ts=0), request("a", 1, 4, [1], ts=2500)), block_size=4)
    s = OpenLoopSchedule(trace, time_scale=0.5)
    assert s.initial() == [Release(0.0, 0), Release(1.25, 1)]
    assert s.on_finish(1, 1.3) == []
    assert s.on_finish(0, 9.0) == []
    assert s.is_done


def test_generated_timestamps_are_a_nominal_closed_loop():
    """Each written timestamp is the release time of a closed loop at the preset's nominal rates."""
    config = preset("agentx_small")
    from ablations.workload import generate

    trace = generate(config, seed=3)
    by_key = {(r.session, r.turn): r for r in trace.requests}
    children = trace.subagents_of()
    checked = 0
    for r in trace.requests:
        waits_for = []
        if r.turn > 0:
            previous = by_key[r.session, r.turn - 1]
            waits_for.append(previous)
            for child in children.get((r.session, r.turn - 1), []):
                waits_for.append(by_key[child, trace.sessions[child].num_turns - 1])
        elif r.parent_session is not None:
            waits_for.append(by_key[r.parent_session, r.parent_turn])
        if waits_for:
            floor = max(w.timestamp_ms + 1000 * w.output_length / config.nominal_decode_tok_s for w in waits_for)
            assert r.timestamp_ms >= floor + r.think_ms - 1
            checked += 1
    assert checked == len(trace.requests) - len(trace.root_sessions)
    assert [r.timestamp_ms for r in trace.requests] == sorted(r.timestamp_ms for r in trace.requests)
