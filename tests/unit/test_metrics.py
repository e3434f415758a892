import math

import pytest

from ablations.metrics import (
    RequestRecord,
    SweepPoint,
    Window,
    cache_hit_rate,
    frontier,
    full_window,
    interactivity,
    percentiles,
    requests_in_window,
    steady_window,
    summarize,
    theoretical_prefix_reuse,
    throughput_at_slo,
    throughput_per_gpu,
    tokens_in_window,
    tokens_per_dollar,
)

# Three requests on a 10 s run, hand-checked:
#   a: arrives 0, first token 1, finishes 5, 100 in (40 cached), 5 out  -> TTFT 1, TPOT (5-1)/4 = 1.0
#   b: arrives 2, first token 2.5, finishes 6.5, 200 in, 9 out          -> TTFT .5, TPOT 4/8 = 0.5
#   c: arrives 4, first token 8, finishes 10, 300 in (300 cached), 1 out -> TTFT 4, no TPOT
A = RequestRecord(0.0, 1.0, 5.0, 100, 5, cached_tokens=40)
B = RequestRecord(2.0, 2.5, 6.5, 200, 9)
C = RequestRecord(4.0, 8.0, 8.0, 300, 1, cached_tokens=300)
RECORDS = [A, B, C]


def test_request_derived_times():
    assert A.ttft_s == 1.0 and A.e2e_s == 5.0 and A.tpot_s == 1.0
    assert B.tpot_s == 0.5
    assert C.tpot_s is None


def test_throughput_full_window_is_design_formula():
    # (100+200+300 + 5+9+1) tokens / (8 - 0) s / 2 GPUs = 615 / 16
    assert full_window(RECORDS) == Window(0.0, 8.0)
    assert throughput_per_gpu(RECORDS, num_gpus=2) == pytest.approx(615 / 16)


def test_tokens_in_partial_window():
    # window [2, 6]: a contributes 4 rest tokens over (1, 5] -> overlap 3 of 4 s -> 3 tokens;
    # b: first token 2.5 inside -> 200 + 1, rest 8 over (2.5, 6.5] -> overlap 3.5 of 4 -> 7 tokens;
    # c: first token at 8 outside, no rest -> 0.
    assert tokens_in_window(RECORDS, Window(2.0, 6.0)) == pytest.approx(3 + 201 + 7)
    assert throughput_per_gpu(RECORDS, 1, Window(2.0, 6.0)) == pytest.approx(211 / 4)


def test_steady_window_skips_warmup_and_drain():
    records = [RequestRecord(float(i), i + 0.5, i + 2.0, 10, 3) for i in range(10)]
    w = steady_window(records, warmup_fraction=0.2, drain_fraction=0.2)
    # arrivals 0..9: skip 2 -> start at 2.0; finishes 2..11: keep first 8 -> end at 9.0
    assert w == Window(2.0, 9.0)
    assert [r.arrival_s for r in requests_in_window(records, w)] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert steady_window(records, 0, 0) == full_window(records)


def test_steady_window_rejects_empty_window():
    with pytest.raises(ValueError, match="leave no window"):
        early, late = RequestRecord(0.0, 0.5, 1.0, 1, 2), RequestRecord(5.0, 5.5, 6.0, 1, 2)
        steady_window([early, late], warmup_fraction=0.5, drain_fraction=0.5)
    with pytest.raises(ValueError, match="warmup_fraction"):
        steady_window(RECORDS, warmup_fraction=1.0)


def test_percentiles_and_interactivity():
    p = percentiles([1.0, 2.0, 3.0, 4.0, 5.0])
    assert p == {"p50": 3.0, "p90": 4.6, "p99": pytest.approx(4.96), "mean": 3.0}
    # TPOTs 0.02 .. 0.11 s: p90 = 0.101 -> 1/0.101 tok/s/user
    tpots = [0.02 + 0.01 * i for i in range(10)]
    assert interactivity(tpots) == pytest.approx(1 / 0.101)
    assert math.isnan(interactivity([]))
    assert math.isnan(percentiles([])["p50"])


def test_cache_hit_rate_and_tokens_per_dollar():
    assert cache_hit_rate(RECORDS) == pytest.approx(340 / 600)
    # 1000 tok/s/GPU at $1.50/GPU-hour -> 2.4M tokens per dollar
    assert tokens_per_dollar(1000.0, 1.50) == pytest.approx(2_400_000)
    with pytest.raises(ValueError, match="price_per_gpu_hour"):
        tokens_per_dollar(1000.0, 0)


def test_summarize_whole_run():
    s = summarize(RECORDS, num_gpus=1, window=full_window(RECORDS))
    assert s.num_requests == s.num_requests_in_window == 3
    assert s.throughput_per_gpu == pytest.approx(615 / 8)
    assert s.output_throughput_per_gpu == pytest.approx(15 / 8)
    assert s.ttft_s["p50"] == 1.0
    assert s.tpot_s["mean"] == 0.75
    assert s.interactivity_p90 == pytest.approx(1 / 0.95)  # p90 of [0.5, 1.0] = 0.95


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(arrival_s=0, first_token_s=1, finish_s=2, input_tokens=-1, output_tokens=2), "input_tokens"),
        (dict(arrival_s=0, first_token_s=1, finish_s=2, input_tokens=1, output_tokens=0), "output_tokens"),
        (dict(arrival_s=0, first_token_s=1, finish_s=2, input_tokens=1, output_tokens=2, cached_tokens=5),
         "cached_tokens"),
        (dict(arrival_s=2, first_token_s=1, finish_s=3, input_tokens=1, output_tokens=2), "arrival_s"),
    ],
)
def test_record_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RequestRecord(**kwargs)


SWEEP = [
    SweepPoint(interactivity=120.0, throughput_per_gpu=400.0, concurrency=1),
    SweepPoint(interactivity=80.0, throughput_per_gpu=1000.0, concurrency=4),
    SweepPoint(interactivity=70.0, throughput_per_gpu=900.0, concurrency=6),  # dominated by the 80 point
    SweepPoint(interactivity=30.0, throughput_per_gpu=2000.0, concurrency=16),
    SweepPoint(interactivity=10.0, throughput_per_gpu=2500.0, concurrency=64),
]


def test_frontier_drops_dominated_points():
    assert [p.interactivity for p in frontier(SWEEP)] == [10.0, 30.0, 80.0, 120.0]


def test_slo_bracketed_interpolates_on_frontier():
    # between (30, 2000) and (80, 1000): 2000 + (50-30)/(80-30) * (1000-2000) = 1600
    v = throughput_at_slo(SWEEP, 50.0)
    assert not v.is_missing and v.value == pytest.approx(1600.0) and v.reason == ""
    assert throughput_at_slo(SWEEP, 80.0).value == pytest.approx(1000.0)


def test_slo_no_point_reaches_target():
    v = throughput_at_slo(SWEEP, 200.0)
    assert v.is_missing and "no point reaches 200" in v.reason


def test_slo_every_point_exceeds_target():
    v = throughput_at_slo(SWEEP, 5.0)
    assert v.is_missing and "every point exceeds 5" in v.reason


def test_slo_past_a_cliff_is_the_last_frontier_point():
    # the sweep went below 90 tok/s/user only by losing throughput: the 80 point meets the target with more
    cliff = [*SWEEP[:3], SweepPoint(interactivity=60.0, throughput_per_gpu=700.0, concurrency=8)]
    v = throughput_at_slo(cliff, 75.0)
    assert not v.is_missing and v.value == 1000.0
    assert throughput_at_slo(SWEEP[:2], 75.0).is_missing      # no point below 75: the sweep stopped short
    unmeasured = [*SWEEP[:2], SweepPoint(interactivity=60.0, throughput_per_gpu=math.nan, concurrency=8)]
    assert throughput_at_slo(unmeasured, 75.0).is_missing


def test_slo_empty_sweep():
    assert throughput_at_slo([], 50.0).is_missing


def test_theoretical_prefix_reuse_by_hand():
    from ablations.workload.trace import Request, Trace

    # block size 4: r0 [1,2,3] all new; r1 [1,2,9] reuses 2; r2 [5,2] reuses 0 (leading block differs)
    reqs = [Request(timestamp_ms=t, input_length=4 * len(h), output_length=1, hash_ids=tuple(h))
            for t, h in enumerate([[1, 2, 3], [1, 2, 9], [5, 2]])]
    assert theoretical_prefix_reuse(Trace(reqs, block_size=4)) == pytest.approx(2 / 8)
