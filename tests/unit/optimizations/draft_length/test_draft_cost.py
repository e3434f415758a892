"""The step cost model: hand values, the fit recovering known coefficients, bad input."""

import math
import random

import pytest

from opts.draft_length.config import COST_FIELDS, DraftLengthConfig
from opts.draft_length.cost import StepCost, expert_share, features, fit_step_cost

LINEAR = StepCost(draft_pass_s=2e-3, draft_token_s=1e-4, verify_pass_s=8e-3, verify_token_s=2e-4)
EXPERTS = StepCost(draft_pass_s=4e-3, draft_token_s=2e-4, verify_pass_s=1.6e-2, verify_token_s=1.6e-3,
                   draft_expert_s=5e-3, verify_expert_s=5e-2, expert_fraction=0.125)
GRID = [(b, k) for b in (1, 2, 3, 4, 6, 8, 16, 32) for k in range(9)]


def test_step_cost_by_hand():
    # 3 drafts over 4 tokens + a verify pass over 4 x 4 tokens
    assert LINEAR.seconds(4, 3) == pytest.approx(3 * (2e-3 + 4 * 1e-4) + 8e-3 + 2e-4 * 16)
    assert LINEAR.seconds(1, 0) == pytest.approx(8e-3 + 2e-4)
    # fraction 1/2: one token touches half the experts, two tokens three quarters
    half = StepCost(0, 0, 0, 0, draft_expert_s=1.0, verify_expert_s=2.0, expert_fraction=0.5)
    assert half.seconds(1, 1) == pytest.approx(1 * 0.5 + 2 * 0.75)
    assert expert_share(3, 0.5) == pytest.approx(0.875)
    assert features(2, 3, 0.5) == pytest.approx((3, 6, 3 * 0.75, 1, 8, 1 - 0.5 ** 8))


@pytest.mark.parametrize("truth", [LINEAR, EXPERTS,
                                   StepCost(draft_pass_s=3e-3, draft_token_s=0.0, verify_pass_s=1e-2,
                                            verify_token_s=5e-4)])
def test_the_fit_recovers_known_coefficients(truth):
    samples = [(b, k, truth.seconds(b, k)) for b, k in GRID]
    fraction = None if truth.expert_fraction == 1.0 else truth.expert_fraction
    fitted = fit_step_cost(samples, expert_fraction=fraction)
    for name in COST_FIELDS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6, abs=1e-12), name
    assert fitted.expert_fraction == truth.expert_fraction


def test_the_fit_under_noise_stays_close_and_non_negative():
    rng = random.Random(0)
    samples = [(b, k, EXPERTS.seconds(b, k) * (1 + rng.gauss(0, 0.01))) for b, k in GRID for _ in range(3)]
    fitted = fit_step_cost(samples, expert_fraction=0.125)
    assert all(v >= 0 for v in fitted.coefficients())
    for b, k in GRID:
        assert fitted.seconds(b, k) == pytest.approx(EXPERTS.seconds(b, k), rel=0.02)


def test_a_linear_truth_fitted_with_expert_terms_needs_none():
    fitted = fit_step_cost([(b, k, LINEAR.seconds(b, k)) for b, k in GRID], expert_fraction=0.125)
    assert fitted.draft_expert_s == pytest.approx(0, abs=1e-9) and fitted.verify_expert_s == pytest.approx(0, abs=1e-9)


def test_from_config_takes_every_coefficient():
    config = DraftLengthConfig(draft_pass_s=1e-3, draft_token_s=2e-3, draft_expert_s=3e-3, verify_pass_s=4e-3,
                               verify_token_s=5e-3, verify_expert_s=6e-3, expert_fraction=0.25)
    cost = StepCost.from_config(config)
    assert cost.coefficients() == (1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3) and cost.expert_fraction == 0.25


@pytest.mark.parametrize("name", COST_FIELDS)
@pytest.mark.parametrize("bad", [-1e-3, math.nan, math.inf, True, "1"])
def test_a_bad_coefficient_is_an_error_naming_it(name, bad):
    values = {"draft_pass_s": 1e-3, "draft_token_s": 1e-4, "verify_pass_s": 1e-2, "verify_token_s": 1e-4, name: bad}
    with pytest.raises(ValueError, match=rf"StepCost\.{name}: invalid value {bad!r}; valid: seconds >= 0"):
        StepCost(**values)


def test_other_bad_input():
    with pytest.raises(ValueError, match=r"StepCost.verify_pass_s \+ verify_token_s \+ verify_expert_s: invalid"):
        StepCost(1e-3, 1e-4, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"StepCost.expert_fraction: invalid value 0; valid: a share of experts"):
        StepCost(1e-3, 1e-4, 1e-3, 1e-4, expert_fraction=0)
    with pytest.raises(ValueError, match=r"K: invalid value -1"):
        LINEAR.seconds(2, -1)
    with pytest.raises(ValueError, match=r"batch: invalid value 0"):
        LINEAR.seconds(0, 1)
    with pytest.raises(ValueError, match=r"samples\[1\].seconds: invalid value -0.5; valid: seconds > 0"):
        fit_step_cost([(1, 0, 0.1), (1, 1, -0.5)])
    with pytest.raises(ValueError, match=r"samples\[0\].batch: invalid value 0"):
        fit_step_cost([(0, 0, 0.1)])
    with pytest.raises(ValueError, match=r"samples\[0\].K: invalid value -2"):
        fit_step_cost([(1, -2, 0.1)])
    with pytest.raises(ValueError, match=r"samples\[0\]: invalid value 0.1; valid: \(batch, K, seconds\)"):
        fit_step_cost([0.1])
    with pytest.raises(ValueError, match=r"samples: 3 samples at 3 distinct \(batch, K\); valid: at least 4"):
        fit_step_cost([(1, 0, 0.1), (1, 1, 0.2), (2, 1, 0.3)])
    with pytest.raises(ValueError, match=r"expert_fraction: invalid value 1.5"):
        fit_step_cost([(b, k, LINEAR.seconds(b, k)) for b, k in GRID], expert_fraction=1.5)
