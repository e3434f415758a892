"""The engine's fast step pricing against the exact cost model: the same seconds (relative 1e-9) on fresh random
steps for every draft count and node, the same rows from the engine's sums as from explicit Seqs, the same
roofline, and a cost that is not linear in the features refused."""

from __future__ import annotations

import numpy as np
import pytest

from ablations.backends.sim.cost import STOCK, Cost, Mechanisms, Parallel, Seq, SimModel
from ablations.backends.sim.step_model import NUM_FEATURES, StepModel, exact_costs, fit, probe_steps
from ablations.backends.sim.timing import roofline_s
from ablations.config import compose_app
from opts.fusion.sim import fused_kda_decode, fused_mla_norm

RTOL = 1e-9


def node(name: str):
    return compose_app([f"hardware={name}"]).hardware


ALL_ON = Mechanisms(packed_kda=True, sharded_latent_up=True, fused_kda_decode=fused_kda_decode,
                    fused_mla_norm=fused_mla_norm)


@pytest.mark.parametrize("num_drafts", [0, 1, 3])
@pytest.mark.parametrize(("hardware", "moe", "mech"), [("mi355x_x8", "ep", STOCK), ("b300_x8", "tp", STOCK),
                                                       ("mi355x_x8", "ep", ALL_ON)])
def test_fast_step_time_equals_the_cost_model(num_drafts, hardware, moe, mech):
    hw, parallel = node(hardware), Parallel(tp=8, moe=moe)
    model = StepModel(SimModel(), parallel, hw, num_drafts, mech=mech)
    kind = "verify" if num_drafts else "decode"
    for seqs in probe_steps(seed=1234, count=25, kind=kind):     # not the fit's probes (seeds 0 and 1)
        exact = model.exact_time(seqs)
        assert model.time(seqs) == pytest.approx(exact, rel=RTOL)
        bound = roofline_s(exact_costs(SimModel(), parallel, seqs, num_drafts, mech), hw)
        assert model.roofline(seqs) == pytest.approx(bound, rel=RTOL)
        assert model.time(seqs) >= model.roofline(seqs)


def test_the_engine_rows_equal_the_rows_of_explicit_seqs():
    model = StepModel(SimModel(), Parallel(), node("mi355x_x8"), 3)
    chunks = [(3000, 20000), (100, 0)]
    contexts = [1000, 250_000, 7, 64_000]
    seqs = [Seq(n, c, "prefill") for n, c in chunks] + [Seq(4, c, "verify") for c in contexts]
    rows = model.batch_features(chunks, len(contexts), np.array([sum(contexts), sum(contexts) + 40]), 4)
    np.testing.assert_allclose(rows[0], model.features(seqs), rtol=1e-12)
    later = [Seq(n, c, "prefill") for n, c in chunks] + [Seq(4, c + 10, "verify") for c in contexts]
    np.testing.assert_allclose(rows[1], model.features(later), rtol=1e-12)
    only_prefill = model.batch_features(chunks, 0, np.array([0.0]), 4)[0]
    np.testing.assert_allclose(only_prefill, model.features(seqs[:2]), rtol=1e-12)


def test_each_later_mtp_pass_runs_over_every_request_of_the_step_prefill_chunks_included():
    """vLLM's drafter runs its K - 1 later passes at one token per row of the batch: a step that only prefills pays
    them too, each as much as the one between K = 1 and K = 2."""
    hw, prefill = node("mi355x_x8"), [Seq(3000, 20_000, "prefill"), Seq(100, 0, "prefill")]
    times = [StepModel(SimModel(), Parallel(), hw, k).time(prefill) for k in (1, 2, 3)]
    assert times[0] < times[1] < times[2]
    assert times[2] - times[1] == pytest.approx(times[1] - times[0], rel=1e-6)
    mixed = [*prefill, Seq(4, 5000, "verify")]
    later = [Seq(1, 23_000, "decode"), Seq(1, 100, "decode"), Seq(1, 5004, "decode")]
    model = StepModel(SimModel(), Parallel(), hw, 3)
    np.testing.assert_allclose(model.features(mixed)[NUM_FEATURES:],
                               model.features(later)[:NUM_FEATURES])


def test_a_cost_not_linear_in_the_features_is_refused():
    def squared(seqs):
        tokens = sum(s.new_tokens for s in seqs)
        return {"lm_head": Cost(flops=float(tokens) ** 3)}
    with pytest.raises(ValueError, match=r"lm_head\.flops is not linear in the step features"):
        fit(squared, SimModel())


def test_the_host_work_per_token_request_and_decode_is_priced_per_scheduled_one_fast_and_exact():
    from dataclasses import replace

    hw = node("mi355x_x8")
    per_token = replace(hw, host_us_per_token=30.0, host_us_per_request=700.0, host_us_per_decode=400.0,
                        sources={**hw.sources, "host_us_per_token": "assumed", "host_us_per_request": "assumed",
                                 "host_us_per_decode": "assumed"},
                        ranges={**hw.ranges, "host_us_per_token": [0, 60], "host_us_per_request": [0, 1000],
                                "host_us_per_decode": [0, 800]})
    base, model = StepModel(SimModel(), Parallel(), hw, 3), StepModel(SimModel(), Parallel(), per_token, 3)
    kinds = set()
    for seqs in probe_steps(seed=99, count=10, kind="verify"):
        tokens = sum(s.new_tokens for s in seqs)
        kinds |= {s.kind for s in seqs}
        decodes = sum(s.kind != "prefill" for s in seqs)
        assert model.time(seqs) == pytest.approx(base.time(seqs) + tokens * 30e-6 + len(seqs) * 700e-6
                                                 + decodes * 400e-6, rel=RTOL)
        assert model.exact_time(seqs) == pytest.approx(model.time(seqs), rel=RTOL)
        assert base.with_host(per_token).time(seqs) == pytest.approx(model.time(seqs), rel=RTOL)
    assert model.with_host(hw).time(seqs) == pytest.approx(base.time(seqs), rel=RTOL)
    assert kinds == {"prefill", "verify"}


@pytest.mark.parametrize("num_drafts", [0, 3])
def test_tiered_prices_each_moe_pass_by_its_own_tokens(num_drafts):
    """moe_dedup tiered: a step of at most `tier` tokens as off, above it the target pass (and the MTP's first)
    as on, each later MTP pass by its own tokens (one per request): fast and exact agree."""
    hw, parallel, tier = node("mi355x_x8"), Parallel(), 4
    tiered = StepModel(SimModel(), parallel, hw, num_drafts, mech=Mechanisms(latent_up_tier=tier))
    off, on = (StepModel(SimModel(), parallel, hw, num_drafts, mech=Mechanisms(sharded_latent_up=s))
               for s in (False, True))
    seen = set()
    for seqs in probe_steps(seed=7, count=60, kind="verify" if num_drafts else "decode"):
        time = tiered.time(seqs)
        assert time == pytest.approx(tiered.exact_time(seqs), rel=RTOL) and time >= tiered.roofline(seqs)
        tokens = sum(s.new_tokens for s in seqs)
        if tokens <= tier:
            assert time == pytest.approx(off.time(seqs), rel=RTOL)
            seen.add("off")
        elif not num_drafts or len(seqs) > tier:       # no later pass, or one above the tier
            assert time == pytest.approx(on.time(seqs), rel=RTOL)
            seen.add("on")
        else:
            assert on.time(seqs) < time < off.time(seqs)
            seen.add("target on, later drafts off")
    assert seen == {"off", "on"} | ({"target on, later drafts off"} if num_drafts else set())


@pytest.mark.parametrize(("hardware", "mech", "graphs", "floor"), [
    ("mi355x_x8", STOCK, "full_decode_only", True), ("b300_x8", ALL_ON, "piecewise", True),
    ("mi355x_x8", STOCK, "full_and_piecewise", False), ("mi355x_x8", Mechanisms(latent_up_tier=64), "none", True)])
def test_the_engine_s_one_product_prices_as_the_step_model_does(hardware, mech, graphs, floor):
    """`price` (one product of the rows with every pass's terms: what the stretches run) against `times` and
    `rooflines`, over steps of prefills, decodes and both, contexts from 0 to 250k, every launch mode, with and
    without a kernel floor (tiered: the two themselves)."""
    import dataclasses

    from ablations.backends.sim.graphs import Graphs

    hw = node(hardware) if floor else dataclasses.replace(node(hardware), kernel_floor_us=0.0)
    launch = Graphs(mode=graphs, max_tokens=512, target_pieces=5, mtp_pieces=2)
    model = StepModel(SimModel(), Parallel(), hw, 3, mech=mech, graphs=launch)
    rng = np.random.default_rng(5)
    for chunks, decodes in [([], 1), ([], 37), ([(7680, 0.0)], 0), ([(4096, 9000.0)], 6), ([(300, 1e5), (64, 0.0)], 3)]:
        context = rng.uniform(0, 250_000 * max(decodes, 1), size=25)
        rows = model.batch_features(chunks, decodes, context, 4)
        times, roofs = model.price(rows)
        np.testing.assert_allclose(times, model.times(rows), rtol=1e-12)
        np.testing.assert_allclose(roofs, model.rooflines(rows), rtol=1e-12)
