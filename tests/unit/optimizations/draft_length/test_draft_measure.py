"""The measured stack (causal verify, deterministic drafts), the timing grid, and the held-out evaluation on
synthetic timings whose answer is known."""

import pytest
import torch

from opts.draft_length.acceptance import expected_tokens_curve, profile_alphas
from opts.draft_length.bench.evaluate import evaluate, quantile, split_repeats, table
from opts.draft_length.bench.stack import Stack, StackShape
from opts.draft_length.bench.step_times import Measurements, Sample, measure
from opts.draft_length.chooser import choose_k, choose_schedule
from opts.draft_length.config import COST_FIELDS
from opts.draft_length.cost import StepCost
from opts.draft_length.schedule import k_for_batch
from opts.k3 import K3Spec

TINY = StackShape(K3Spec(
    name="tiny", num_layers=4, num_kda_layers=3, hidden=64, mla_heads=2, q_lora_rank=32, kv_lora_rank=32,
    rope_dim=8, qk_nope_dim=16, v_head_dim=16, kda_heads=2, kda_head_dim=16, conv_width=4, num_experts=4,
    num_shared_experts=1, experts_per_token=2, expert_latent=32, moe_intermediate=16, attn_res_block=2,
    mtp_layers=1), vocab=128, context=8)
TRUTH = StepCost(draft_pass_s=4e-3, draft_token_s=2e-4, verify_pass_s=1.6e-2, verify_token_s=1.6e-3,
                 draft_expert_s=5e-3, verify_expert_s=5e-2, expert_fraction=0.125)


@torch.inference_mode()
def test_verify_is_causal_and_leaves_the_recurrent_states_alone():
    stack = Stack.random(TINY, seed=1)
    cache = stack.new_cache(3, 5, seed=2)
    states = [s.clone() for s in cache.kda_states]
    tokens = torch.randint(0, TINY.vocab, (3, 5), generator=torch.Generator().manual_seed(3))
    target, hidden = stack.verify(cache, tokens)
    assert target.shape == (3, 5) and hidden.shape == (3, 5, TINY.spec.hidden)
    assert all(torch.equal(a, b) for a, b in zip(states, cache.kda_states, strict=True))
    for t in (1, 3):
        first_target, first_hidden = stack.verify(cache, tokens[:, :t])
        torch.testing.assert_close(first_hidden, hidden[:, :t], rtol=1e-5, atol=1e-5)
        assert torch.equal(first_target, target[:, :t])


@torch.inference_mode()
def test_drafts_are_greedy_deterministic_and_each_sees_only_the_ones_before():
    stack = Stack.random(TINY, seed=1)
    cache = stack.new_cache(2, 5, seed=2)
    tokens = torch.tensor([5, 7])
    hidden = torch.randn(2, TINY.spec.hidden, generator=torch.Generator().manual_seed(4))
    drafts = stack.draft(cache, tokens, hidden, 4)
    assert drafts.shape == (2, 4) and drafts.dtype == torch.int64
    assert int(drafts.min()) >= 0 and int(drafts.max()) < TINY.vocab
    assert torch.equal(stack.draft(cache, tokens, hidden, 4), drafts)
    assert torch.equal(stack.draft(cache, tokens, hidden, 2), drafts[:, :2])
    assert stack.draft(cache, tokens, hidden, 0).shape == (2, 0)


def test_measure_times_every_cell_every_repeat_and_restores_threads():
    before = torch.get_num_threads()
    lines = []
    m = measure([2, 1], [0, 2], 2, shape=TINY, threads=1, progress=lines.append)
    assert torch.get_num_threads() == before
    assert m.batch_sizes == (1, 2) and m.ks == (0, 2) and len(m.samples) == 8 and len(lines) == 2
    assert all(s.verify_s > 0 and s.draft_s >= 0 for s in m.samples)
    assert all(s.draft_s > 0 for s in m.samples if s.k > 0)
    assert len(m.seconds(1, 2)) == 2 and m.median(1, 2) > 0
    assert m.to_dict()["samples"][0].keys() == {"batch", "k", "repeat", "verify_s", "draft_s"}


def synthetic(batch_sizes, ks, repeats, scale=lambda b, k, r: 1.0):
    samples = tuple(Sample(b, k, r, TRUTH.seconds(b, k) * scale(b, k, r), 0.0)
                    for b in batch_sizes for k in ks for r in range(repeats))
    return Measurements(StackShape(), tuple(batch_sizes), tuple(ks), repeats, 1, samples)


def test_evaluate_on_exact_timings_recovers_the_model_and_the_hindsight_best():
    batch_sizes, ks = (1, 2, 3, 4, 6, 8, 16, 32), tuple(range(9))
    result = evaluate(synthetic(batch_sizes, ks, 4))
    for name in COST_FIELDS:
        assert getattr(result.cost, name) == pytest.approx(getattr(TRUTH, name), rel=1e-6, abs=1e-12)
    assert result.noise == 0 and result.fit_error["model"]["max"] < 1e-9
    assert result.fit_error["linear_model"]["max"] > 0.05
    for profile in ("flat", "decaying"):
        alphas = profile_alphas(profile, 8)
        assert result.schedules[profile] == choose_schedule(TRUTH, alphas, ks=ks, max_batch_size=32)
        curve = expected_tokens_curve(alphas, 8)
        for row in (r for r in result.rows if r.profile == profile):
            assert row.chosen_k == k_for_batch(result.schedules[profile], row.batch)
            assert row.best_k == choose_k(TRUTH, alphas, row.batch, ks)
            assert row.fixed_goodput == pytest.approx(row.batch * curve[3] / TRUTH.seconds(row.batch, 3))
            assert row.regret == pytest.approx(1 - TRUTH.seconds(row.batch, row.best_k) * curve[row.chosen_k]
                                               / (TRUTH.seconds(row.batch, row.chosen_k) * curve[row.best_k]))
            assert row.regret >= 0
    assert "| [2, 3] | 2 |" in table(result) and "linear model" in table(result)


def test_noise_is_the_half_to_half_spread():
    # cell (4, 2): odd repeats 10% slower -> |t - 1.1 t| / median(t, 1.1 t, t, 1.1 t) = 0.1 / 1.05
    m = synthetic((1, 2, 4, 8), tuple(range(5)), 4, lambda b, k, r: 1.1 if (b, k) == (4, 2) and r % 2 else 1.0)
    result = evaluate(m)
    assert result.cell_noise[(4, 2)] == pytest.approx(0.1 / 1.05)
    assert sum(v > 0 for v in result.cell_noise.values()) == 1
    row = next(r for r in result.rows if r.batch == 4 and r.profile == "flat")
    cells = result.cell_noise[(4, row.chosen_k)] + result.cell_noise[(4, 3)]
    assert row.noise == (0.0 if row.chosen_k == 3 else pytest.approx(max(result.noise, cells)))
    assert result.noise == quantile(list(result.cell_noise.values()), 0.9)
    assert quantile([3, 1, 2, 4], 0.5) == 2 and quantile([3, 1, 2, 4], 0.9) == 4


def test_bad_input():
    m = synthetic((1, 2, 4, 8), (0, 1, 2), 2)
    with pytest.raises(ValueError, match=r"fixed_k: invalid value 3; valid: a measured K \(0, 1, 2\)"):
        evaluate(m)
    with pytest.raises(ValueError, match=r"repeats: invalid value 1; valid: an integer >= 2"):
        split_repeats(1)
    assert split_repeats(5) == ((0, 2, 4), (1, 3))
    with pytest.raises(ValueError, match=r"Measurements.samples: 5 samples; valid: one per"):
        Measurements(StackShape(), (1,), (0, 1, 2), 2, 1, m.samples[:5])
    with pytest.raises(ValueError, match=r"batch_sizes\[\]: invalid value 0"):
        measure([0, 1], [0], 2, shape=TINY)
    with pytest.raises(ValueError, match=r"ks: invalid value \[1, 1\]; valid: no value twice"):
        measure([1], [1, 1], 2, shape=TINY)
    with pytest.raises(ValueError, match=r"StackShape.context: invalid value 0"):
        StackShape(context=0)
