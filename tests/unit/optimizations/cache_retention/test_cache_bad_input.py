"""Bad input to the cache model: a clear error naming the field, or a stated fallback."""

import math

import pytest
from cache_retention_helpers import TOY, request, tokens

from ablations.workload.cache_stream import cache_stream
from ablations.workload.trace import Request, Trace
from opts.cache_retention.config import CacheRetentionConfig
from opts.cache_retention.evict import SessionFreeList
from opts.cache_retention.retention import run
from opts.k3.cache import HybridPool
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import TINY, CacheGeometry
from opts.k3.cache.stream import CacheRequest, CacheStream


@pytest.mark.parametrize("capacity", [0, -1, -2.5, math.inf, math.nan, True, "1 GiB"])
def test_capacity_in_bytes_must_be_positive(capacity):
    with pytest.raises(ValueError, match=r"capacity_bytes: invalid value"):
        TINY.num_blocks(capacity)


@pytest.mark.parametrize("num_blocks", [0, -3, 2.0, True])
def test_a_pool_needs_at_least_one_block(num_blocks):
    with pytest.raises(ValueError, match=rf"num_blocks: invalid value {num_blocks!r}; valid: an integer >= 1"):
        HybridPool(TOY, num_blocks, LruFreeList(), resume=None, chunk_size=4)
    stream = CacheStream((request(0, 1, tokens("a", 4), 3, 1, "A"),), 4)
    for mode in ("off", "on"):
        with pytest.raises(ValueError, match=r"num_blocks: invalid value"):
            run(stream, TOY, num_blocks, CacheRetentionConfig(mode=mode))


@pytest.mark.parametrize("field", ["block_size", "block_bytes", "num_attn_groups", "num_state_groups"])
@pytest.mark.parametrize("value", [0, -128, 1.5])
def test_geometry_fields_must_be_positive_integers(field, value):
    kwargs = {"name": "bad", "block_size": 4, "block_bytes": 1, "num_attn_groups": 1, "num_state_groups": 1,
              "state_bytes": 1, "latent_bytes_per_token": 1, field: value}
    if field == "num_state_groups" and value == 0:
        kwargs["state_bytes"] = 0           # no state, no state groups: valid (an attention-only model)
        assert CacheGeometry(**kwargs).num_state_groups == 0
        return
    with pytest.raises(ValueError, match=rf"CacheGeometry\.{field}: invalid value {value!r}"):
        CacheGeometry(**kwargs)


def test_a_geometry_has_a_state_exactly_when_it_has_state_groups():
    kwargs = {"name": "bad", "block_size": 4, "block_bytes": 1, "num_attn_groups": 1, "latent_bytes_per_token": 1}
    CacheGeometry(**kwargs, num_state_groups=0, state_bytes=0)          # attention only: no state
    for groups, state in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match=rf"num_state_groups {groups} and state_bytes {state}: both 0"):
            CacheGeometry(**kwargs, num_state_groups=groups, state_bytes=state)


@pytest.mark.parametrize("chunk_size", [0, -16, True])
def test_stream_chunk_size_must_be_positive(chunk_size):
    with pytest.raises(ValueError, match=rf"trace\.jsonl: chunk_size: invalid value {chunk_size!r}"):
        CacheStream((), chunk_size, source="trace.jsonl")


def test_stream_requests_are_checked():
    a = tokens("a", 10)
    with pytest.raises(ValueError, match=r"request 0: chunk_ids: 2 chunks of 4 do not cover the 9-token prompt"):
        CacheStream((CacheRequest(0, 1, 9, 1, (1, 2), "A"),), 4)
    with pytest.raises(ValueError, match=r"request 0: prompt and output need >= 1 token, got 3 and 0"):
        CacheStream((CacheRequest(0, 1, 3, 0, (1,)),), 4)
    with pytest.raises(ValueError, match=r"request 1: times"):
        CacheStream((request(2, 3, a, 3, 1), request(1, 4, a, 3, 1)), 4)
    with pytest.raises(ValueError, match=r"request 0: continues: 0 is not an earlier request"):
        CacheStream((request(0, 1, a, 3, 1, "A", continues=0),), 4)


@pytest.mark.parametrize("mode", ["evict", "resume", "on"])
def test_a_stream_without_sessions_runs_off_and_says_so(mode):
    """No session ids: every mode runs off and states it. The first (9 + 2) caches its state at floor(8/4)*4 = 8, the
    second shares its first 8 tokens: 8."""
    a = tokens("a", 20)
    stream = CacheStream((request(0, 1, a, 9, 2), request(2, 3, a[:8] + tokens("b", 6), 12, 1)), 4)
    off = run(stream, TOY, 16, CacheRetentionConfig(mode="off"))
    stats = run(stream, TOY, 16, CacheRetentionConfig(mode=mode))
    assert stats.hits == off.hits == [0, 8]
    assert "fallback" not in off.info
    assert stats.info["fallback"] == "no session ids in the stream: session-aware retention runs as off"
    assert stats.summary()["fallback"] == stats.info["fallback"]


def test_cache_stream_of_a_trace_without_sessions_has_none():
    trace = Trace((Request(0.0, 20, 2, (1, 2)), Request(10.0, 20, 2, (1, 3))), block_size=16)
    stream = cache_stream(trace)
    assert not stream.has_sessions
    assert run(stream, TINY, 8, CacheRetentionConfig(mode="on")).info["fallback"]
    with pytest.raises(ValueError, match=r"prefill_tok_s: invalid value 0"):
        cache_stream(trace, prefill_tok_s=0)


@pytest.mark.parametrize("idle_s", [0, -1.0])
def test_session_free_list_needs_a_positive_idle_time(idle_s):
    with pytest.raises(ValueError, match=rf"idle_s: invalid value {idle_s!r}; valid: seconds > 0"):
        SessionFreeList(idle_s=idle_s)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mode": "sometimes"}, r"CacheRetentionConfig\.mode: invalid value 'sometimes'"),
    ({"idle_s": 0}, r"CacheRetentionConfig\.idle_s: invalid value 0"),
    ({"idle_s": math.inf}, r"CacheRetentionConfig\.idle_s: invalid value inf"),
    ({"resume_unit": 16}, r"CacheRetentionConfig\.resume_unit: invalid value 16 with resume_from='turn_end'"),
    ({"resume_from": "prompt_end"}, r"CacheRetentionConfig\.resume_from: invalid value 'prompt_end'; valid choices: "
                                    r"turn_end, prompt_tail"),
    ({"resume_from": "prompt_tail", "resume_unit": 0}, r"CacheRetentionConfig\.resume_unit: invalid value 0"),
])
def test_config_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheRetentionConfig(**kwargs)


def test_config_modes():
    flags = {m: (CacheRetentionConfig(mode=m).is_evict, CacheRetentionConfig(mode=m).is_resume)
             for m in ("off", "evict", "resume", "on")}
    assert flags == {"off": (False, False), "evict": (True, False), "resume": (False, True), "on": (True, True)}
    assert CacheRetentionConfig(mode="resume", resume_from="prompt_tail", resume_unit=64).resume_unit == 64
