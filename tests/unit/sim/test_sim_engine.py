"""The simulated engine: stretches priced exactly as step by step, determinism, the roofline never beaten,
the token budget's chunks, max_num_seqs, accepted drafts at the acceptance model's rate, the pool's capacity,
cache_retention acting through the pool, and a cell's result."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from functools import cache

import numpy as np
import pytest

from ablations.backends.sim.cell import run_point, run_sim_cell, shared_keys, sim_setup
from ablations.backends.sim.checks import wired as sim_wired
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.sim.cost import Parallel, Seq, SimModel
from ablations.backends.sim.engine import (
    SchedulerConfig,
    accepted_draws,
    prefill_chunk,
    simulate,
    trace_keys,
    uniforms,
)
from ablations.backends.sim.step_model import DraftSteps, StepModel
from ablations.config import compose_app
from ablations.run import run
from ablations.workload.generate import generate
from ablations.workload.presets import preset
from ablations.workload.trace import Request, Trace
from opts.draft_length.acceptance import expected_tokens
from opts.k3.cache import CapacityError, Resume
from opts.k3.cache.free_list import LruFreeList
from opts.k3.cache.geometry import k3_geometry
from opts.registry import OPTIMIZATIONS, make_config

ALPHAS = (0.8, 0.8, 0.8)


@cache
def hardware(name: str = "mi355x_x8"):
    return compose_app([f"hardware={name}"]).hardware


@cache
def steps(num_drafts: int = 3, name: str = "mi355x_x8") -> StepModel:
    return StepModel(SimModel(), Parallel(), hardware(name), num_drafts)


@cache
def agentx(num_sessions: int) -> Trace:
    return generate(preset("agentx"), seed=0).head_sessions(num_sessions)


def replay(trace: Trace, *, num_blocks: int = 2400, num_drafts: int = 3, alphas=ALPHAS, **kw):
    geometry = k3_geometry(num_spec_tokens=num_drafts)
    return simulate(trace, steps(num_drafts), geometry, num_blocks, LruFreeList(), resume=None, alphas=alphas, **kw)


def toggles(**modes: str) -> dict:
    return {name: make_config(name, mode=modes.get(name, "off")) for name in OPTIMIZATIONS}


def test_stretches_price_every_step_exactly_as_one_at_a_time():
    trace = agentx(3)
    fast, fast_stats = replay(trace, concurrency=2)
    slow, slow_stats = replay(trace, concurrency=2, stretches=False)
    assert fast_stats.num_stretch_steps > 0.9 * fast_stats.num_steps and slow_stats.num_stretch_steps == 0
    assert fast_stats.num_steps == slow_stats.num_steps
    for a, b in zip(fast, slow, strict=True):
        assert (a.input_tokens, a.output_tokens, a.cached_tokens) == (b.input_tokens, b.output_tokens, b.cached_tokens)
        for field in ("arrival_s", "first_token_s", "finish_s"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-9)


@pytest.mark.parametrize("third_at_ms", [None, 60.0, 400.0])
def test_a_prefill_s_chunks_of_every_size_beside_decodes_are_one_stretch(third_at_ms):
    """A 20,000-token prompt admitted beside a decode: its chunks (7,680, 7,680, 3,840 to the MTP checkpoint at
    19,200, then 800) run in one stretch up to the one that completes it, priced as step by step. A third request
    (a budget of 7,680 tokens beside the decode, so that whole chunks leave none), queued before the prompt is
    admitted (60 ms) or released during its prefill (400 ms), is admitted by the first step whose chunk leaves
    budget: the stretch ends before it."""
    requests = [one_request(600, 400), one_request(20_000, 3, 50.0, hash_base=1000)]
    if third_at_ms is not None:
        requests.append(one_request(3000, 5, third_at_ms, hash_base=2000))
    trace = Trace(tuple(requests), 512)
    kw = {"scheduler": SchedulerConfig(max_num_batched_tokens=8192 if third_at_ms is None else 7684)}
    fast, fast_stats = replay(trace, **kw)
    slow, slow_stats = replay(trace, stretches=False, **kw)
    assert slow_stats.num_iterations == slow_stats.num_steps == fast_stats.num_steps
    assert fast_stats.num_mixed_steps == slow_stats.num_mixed_steps
    if third_at_ms is None:      # the prefill alone, its four chunks beside the decode, the two decoding, one alone
        assert fast_stats.num_mixed_steps == 4 and fast_stats.num_iterations == 4
    for a, b in zip(fast, slow, strict=True):
        assert a.cached_tokens == b.cached_tokens
        for field in ("first_token_s", "finish_s"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), rel=1e-9)


def test_a_process_names_a_trace_s_blocks_once_per_block_size():
    trace, other = agentx(2), agentx(3)
    keys = shared_keys(trace, 768)
    assert keys == trace_keys(trace, 768) and shared_keys(trace, 768) is keys
    assert shared_keys(trace, 512) == trace_keys(trace, 512) and shared_keys(trace, 768) is keys
    assert shared_keys(other, 768) == trace_keys(other, 768) and shared_keys(other, 768) is not keys


def test_the_same_config_and_seed_give_the_same_bytes():
    setup = sim_setup(SimBackendConfig(), "kimi_k3", hardware(), toggles())

    keys = trace_keys(agentx(2), setup.geometry.block_size)

    def result(seed: int, shared=None) -> str:
        point = run_point(setup, agentx(2), 2, seed, shared)
        point.pop("wall_s")
        return json.dumps(point, sort_keys=True)
    assert result(0) == result(0) == result(0, keys) == result(0, keys)      # keys shared by replays, never changed
    assert result(0) != result(1)


@pytest.mark.parametrize("node", ["mi355x_x8", "b300_x8"])
def test_no_simulated_step_beats_its_roofline(node):
    geometry = k3_geometry(num_spec_tokens=3)
    _, stats = simulate(agentx(3), steps(3, node), geometry, 2400, LruFreeList(), resume=None, alphas=ALPHAS,
                        concurrency=3)
    assert stats.num_steps > 1000 and 1.0 <= stats.min_roofline_ratio < math.inf


def one_request(prompt: int, output: int, at_ms: float = 0.0, hash_base: int = 0) -> Request:
    return Request(at_ms, prompt, output, tuple(range(hash_base, hash_base + -(-prompt // 512))))


@pytest.mark.parametrize(("num_drafts", "chunks"), [
    # vLLM's split for a hybrid model ("align"): chunks end on 768-token blocks, and stop at the prompt's KDA
    # checkpoint, the last full block before its last token (19,968), one block earlier with MTP (19,200)
    (0, [(7680, 0), (7680, 7680), (4608, 15360), (32, 19968)]),
    (3, [(7680, 0), (7680, 7680), (3840, 15360), (800, 19200)]),
])
def test_a_long_prompt_is_prefilled_in_block_aligned_chunks_of_the_token_budget(num_drafts, chunks):
    trace = Trace((one_request(20_000, 1),), 512)
    records, stats = replay(trace, num_drafts=num_drafts, alphas=ALPHAS[:num_drafts],
                            scheduler=SchedulerConfig(max_num_batched_tokens=8192))
    want = sum(steps(num_drafts).time([Seq(n, c, "prefill")]) for n, c in chunks)
    assert stats.num_steps == len(chunks)
    assert records[0].first_token_s == pytest.approx(want, rel=1e-9) == records[0].finish_s


def test_a_prompt_s_first_token_waits_for_every_mtp_pass_of_its_prefill():
    trace = Trace((one_request(600, 1),), 512)
    ttft = [replay(trace, num_drafts=k, alphas=ALPHAS[:k])[0][0].first_token_s for k in (1, 2, 3)]
    assert ttft[0] < ttft[1] < ttft[2]


def test_max_num_seqs_runs_requests_one_after_another():
    trace = Trace(tuple(one_request(600, 20, hash_base=100 * i) for i in range(3)), 512)
    records, _ = replay(trace, scheduler=SchedulerConfig(max_num_seqs=1))
    for before, after in itertools.pairwise(records):
        assert after.first_token_s > before.finish_s
    together, _ = replay(trace)
    assert together[2].finish_s < records[2].finish_s


@pytest.mark.parametrize("num_blocks", [40, 60])
def test_requests_that_outgrow_the_cache_are_preempted_and_recomputed(num_blocks):
    # 12 requests of 3,000 + 3,000 tokens at once: admitted on their prompts' blocks, they run out while decoding
    trace = Trace(tuple(one_request(3000, 3000, hash_base=100 * i) for i in range(12)), 512)
    records, stats = replay(trace, num_blocks=num_blocks)
    assert stats.num_preemptions > 0 and stats.cache["num_preemptions"] == stats.num_preemptions
    assert [r.output_tokens for r in records] == [3000] * 12
    slow, slow_stats = replay(trace, num_blocks=num_blocks, stretches=False)
    assert slow_stats.num_preemptions == stats.num_preemptions and slow_stats.num_steps == stats.num_steps
    for a, b in zip(records, slow, strict=True):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9)
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9)
    roomy, roomy_stats = replay(trace, num_blocks=400)
    assert roomy_stats.num_preemptions == 0 and max(r.finish_s for r in roomy) < max(r.finish_s for r in records)


def schedule_replay(trace: Trace, schedule, concurrency: int | None, **kw):
    models = {k: steps(k) for _, _, k in schedule}
    alphas = (0.8,) * max(models)
    return simulate(trace, DraftSteps(models, schedule), k3_geometry(num_spec_tokens=max(models)), 2400,
                    LruFreeList(), resume=None, alphas=alphas, concurrency=concurrency, **kw)


def test_a_draft_schedule_of_one_k_runs_as_that_fixed_k():
    fixed = replay(agentx(2), concurrency=2)
    assert schedule_replay(agentx(2), ((1, 4, 3), (5, 1024, 3)), 2) == fixed


def test_each_step_verifies_the_k_of_its_running_requests():
    # K = 4 while one request runs, 1 beside others (draft_length on's schedule, vLLM's lookup by batch size)
    schedule = ((1, 1, 4), (2, 1024, 1))
    apart = Trace(tuple(one_request(3000, 400, at_ms=60_000 * i, hash_base=100 * i) for i in range(4)), 512)
    alone = schedule_replay(apart, schedule, None)
    assert alone == replay(apart, num_drafts=4, alphas=(0.8,) * 4)       # never two running at once: K = 4
    fast, stats = schedule_replay(agentx(3), schedule, 2)
    slow, slow_stats = schedule_replay(agentx(3), schedule, 2, stretches=False)
    assert stats.num_steps == slow_stats.num_steps and stats.drafts == slow_stats.drafts
    for a, b in zip(fast, slow, strict=True):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9)
    # each step accepts at most its K: between K = 4's share of drafts accepted (E(4) - 1 of 4) and K = 1's (0.8)
    four = (expected_tokens((0.8,) * 4, 4) - 1) / 4
    assert four + 0.02 < stats.accepted / stats.drafts < 0.8 - 0.02


def test_accepted_drafts_follow_the_acceptance_model():
    _, stats = replay(agentx(2), concurrency=2)
    assert stats.drafts > 10_000
    # per verification: E(K) - 1 accepted of K drafted (the last step of a request cut short)
    assert stats.accepted / stats.drafts == pytest.approx((expected_tokens(ALPHAS, 3) - 1) / 3, rel=0.02)
    _, none = replay(agentx(1), num_drafts=0, alphas=())
    assert none.drafts == 0 and none.accepted == 0


def test_a_request_larger_than_the_pool_is_a_capacity_error_naming_it():
    trace = Trace((one_request(600, 4), one_request(200_000, 4, at_ms=1.0, hash_base=50)), 512)
    with pytest.raises(CapacityError, match=r"request 1 \(200000 prompt \+ 4 output tokens\) needs \d+ blocks"):
        replay(trace, num_blocks=100)


def test_k3_on_h200_at_tp8_does_not_fit_and_says_by_how_much():
    with pytest.raises(ValueError, match=r"72\.7 GB more than the 134\.7 GB usable"):
        sim_setup(SimBackendConfig(), "kimi_k3", hardware("h200_x8"), toggles())


def test_unmodelled_modes_and_models_are_refused_by_name():
    with pytest.raises(ValueError, match=r"opts\.kda_overlap: mode 'streams' is a GPU mode: a CPU has no streams; "
                                         r"valid: off, on"):
        sim_setup(SimBackendConfig(tp=1), "k3_tiny", hardware("cpu"), toggles(kda_overlap="streams"))
    with pytest.raises(ValueError, match=r"opts\.aiter_mla: mode 'on' is not a kernel vLLM has on CUDA; valid: off"):
        sim_setup(SimBackendConfig(), "kimi_k3", hardware("b300_x8"), toggles(aiter_mla="on"))
    with pytest.raises(ValueError, match=r"model: 'k2' is not modelled by backend=sim; valid: kimi_k3, k3_tiny"):
        sim_setup(SimBackendConfig(), "k2", hardware(), toggles())


def test_cache_retention_on_raises_the_hit_rate_and_lowers_ttft_under_capacity_pressure():
    trace = agentx(16)        # 8 live sessions' contexts overflow 50 GB of cache per rank
    off, on = (run_point(sim_setup(SimBackendConfig(cache_gb=50.0), "kimi_k3", hardware(),
                                   toggles(cache_retention=mode)), trace, 8, 0)["metrics"] for mode in ("off", "on"))
    assert on["prefix_hit_rate"] > off["prefix_hit_rate"] + 0.05
    assert on["ttft_p50_s"] < 0.8 * off["ttft_p50_s"]


def test_a_bracket_search_runs_only_the_points_around_the_target_and_reads_the_same_headline():
    every = SimBackendConfig(concurrency=[1, 2, 4, 8], workers=1)
    full = run_sim_cell(every, "kimi_k3", hardware(), toggles(), agentx(8))
    inter = {p["concurrency"]: p["interactivity"] for p in full["points"]}
    assert inter[1] > inter[2] > inter[4] > inter[8]
    target = (inter[2] + inter[4]) / 2
    want = run_sim_cell(dataclasses.replace(every, target_interactivity=target), "kimi_k3", hardware(), toggles(),
                        agentx(8))["slo"]["tput_per_gpu"]
    for start, ran in ((4, [2, 4]), (1, [1, 2, 4]), (8, [2, 4, 8])):
        backend = dataclasses.replace(every, target_interactivity=target, bracket_from=start)
        cell = run_sim_cell(backend, "kimi_k3", hardware(), toggles(), agentx(8))
        assert [p["concurrency"] for p in cell["points"]] == ran
        assert all(p == next(q for q in full["points"] if q["concurrency"] == p["concurrency"]) for p in cell["points"])
        assert cell["slo"]["tput_per_gpu"] == want
    with pytest.raises(ValueError, match=r"backend\.bracket_from: invalid value 3; valid: 0 \(every point\) or one of"):
        SimBackendConfig(concurrency=[1, 2, 4], bracket_from=3)


def test_a_sim_run_writes_the_result_of_a_cell(tmp_path):
    app = compose_app(["backend=sim", "model=kimi_k3", "hardware=mi355x_x8", "backend.concurrency=[1,2,4]",
                       "workload.num_sessions=3", "backend.workers=1"])
    result = run(app, tmp_path)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["backend"] == "sim" and saved["cell"]["hardware"] == "mi355x_x8"
    assert [p["concurrency"] for p in saved["points"]] == [1, 2, 4]
    assert set(saved["metrics"]) >= {"total_throughput", "ttft_p50_s", "interactivity_p90", "prefix_hit_rate"}
    slo = saved["cell"]["slo"]
    if slo["tput_per_gpu"] is None:
        assert slo["reason"] and "tput_per_gpu_at_slo" not in saved["metrics"]
    else:
        assert saved["metrics"]["tokens_per_dollar_at_slo"] == pytest.approx(slo["tput_per_gpu"] * 3600 / 1.5)
    assert result["metrics"] == saved["metrics"]
    assert dataclasses.is_dataclass(app.backend) and app.backend.name == "sim"


@pytest.mark.spawns
def test_points_on_two_processes_equal_points_in_this_one():
    trace = agentx(3)
    cells = [run_sim_cell(SimBackendConfig(concurrency=[1, 2, 3, 4], workers=workers), "kimi_k3", hardware(),
                          toggles(), trace) for workers in (1, 2)]
    for cell in cells:
        for point in cell["point_details"]:
            point.pop("wall_s")
    assert json.dumps(cells[0], sort_keys=True) == json.dumps(cells[1], sort_keys=True)


def test_a_reprefill_preempted_again_keeps_what_it_had_to_recompute():
    # a budget of 32 tokens keeps re-prefills in flight when the next preemption comes
    trace = Trace(tuple(one_request(3000, 3000, hash_base=100 * i) for i in range(3)), 512)
    kw = {"num_blocks": 18, "scheduler": SchedulerConfig(max_num_batched_tokens=32)}
    records, stats = replay(trace, **kw)
    slow, slow_stats = replay(trace, stretches=False, **kw)
    assert stats.num_preemptions > 3 and slow_stats.num_preemptions == stats.num_preemptions
    assert [r.output_tokens for r in records] == [3000] * 3
    for a, b in zip(records, slow, strict=True):
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9)


def test_every_cache_retention_mode_is_a_wired_toggle_of_the_simulator():
    for mode in ("on", "evict", "resume"):
        assert "cache_retention" in sim_wired("rocm", {"on": {"cache_retention": mode}})
    assert "aiter_mla" in sim_wired("rocm") and "aiter_mla" not in sim_wired("cuda")


@pytest.mark.parametrize(("start", "target", "budget", "block", "max_tokens", "stops", "chunk"), [
    (0, 300, 64, 128, 64, (), 64),              # a block wider than a step: the sub-block chunk is kept
    (256, 300, 64, 128, 64, (), 44),            # the prompt's end
    (0, 300, 64, 128, 64, (32,), 32),           # a state to cache (junction, checkpoint, prompt tail)
    (272, 400, 64, 128, 64, (), 64),            # inside a block, past its end: kept, then ...
    (336, 400, 64, 128, 64, (), 48),            # ... stopped at the block's end
    (0, 20_000, 8192, 768, 8192, (), 7680),     # K3's blocks fit a step: chunks end on them
    (1706, 20_000, 50, 768, 8192, (), 0),       # nothing block-aligned fits what is left: vLLM's 0, never below
    (1706, 20_000, 50, 128, 64, (), 50),
])
def test_prefill_chunks_are_vllms_block_aligned_split(start, target, budget, block, max_tokens, stops, chunk):
    assert prefill_chunk(start, target, budget, block, max_tokens, stops) == chunk


def test_a_budget_of_a_block_or_more_always_fits_a_chunk():
    """What lets the engine admit the queue's head without looking its hit up first: with a block's budget or
    more, some chunk fits from any start below the target (K3's 768-token blocks; a block wider than a step)."""
    for block, max_tokens in ((768, 8192), (128, 64)):
        for start in range(0, 3 * block, 17):
            for budget in (block, block + 1, 2 * block - 1, 5 * block):
                for target in (start + 1, start + block // 2, start + 4 * block):
                    assert prefill_chunk(start, target, budget, block, max_tokens) > 0, (start, target, budget)


def test_a_budget_left_under_a_block_prices_stretches_as_steps():
    """K3's 768-token blocks under an 800-token budget, turns resumed at their ends (inside a block): a chunk or an
    admission that no block-aligned chunk fits waits, step by step and in stretches alike."""
    kw = {"scheduler": SchedulerConfig(max_num_batched_tokens=800), "concurrency": 3, "resume": Resume()}
    geometry = k3_geometry(num_spec_tokens=3)
    fast, fast_stats = simulate(agentx(3), steps(3), geometry, 2400, LruFreeList(), alphas=ALPHAS, **kw)
    slow, slow_stats = simulate(agentx(3), steps(3), geometry, 2400, LruFreeList(), alphas=ALPHAS, stretches=False,
                                **kw)
    assert fast_stats.num_steps == slow_stats.num_steps and fast_stats.num_stretch_steps > fast_stats.num_steps / 2
    for a, b in zip(fast, slow, strict=True):
        assert a.cached_tokens == b.cached_tokens
        assert a.finish_s == pytest.approx(b.finish_s, rel=1e-9)


@pytest.mark.parametrize("alphas", [(0.8, 0.8, 0.8), (0.9, 0.7, 0.85, 0.6, 0.99, 0.75, 0.8), (1.0, 1.0, 0.5),
                                    (0.7, 0.0)])
def test_a_verification_accepts_as_many_drafts_as_its_uniform_passes(alphas):
    """accepted_draws against its definition, #{j : u < alphas[0]···alphas[j-1]}, one uniform a step."""
    u = uniforms(3, 17, 5000)
    want = np.array([sum(x < c for c in np.cumprod(alphas)) for x in u])
    assert np.array_equal(accepted_draws(3, 17, alphas, 5000), want)
