"""What the package hands vLLM passes vLLM's own checks: the per-batch-size schedule (and vLLM's lookup runs the K
`k_for_batch` says) and the cumulative synthetic acceptance rates."""

import contextlib

import pytest

from opts.draft_length.acceptance import config_alphas, profile_alphas, to_cumulative
from opts.draft_length.chooser import choose_schedule, policy
from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.cost import StepCost
from opts.draft_length.schedule import k_for_batch

COSTS = [StepCost.from_config(DraftLengthConfig()),
         StepCost(draft_pass_s=1e-4, draft_token_s=1e-5, verify_pass_s=2e-2, verify_token_s=1e-4),
         StepCost(draft_pass_s=4e-3, draft_token_s=2e-4, verify_pass_s=1.6e-2, verify_token_s=1.6e-3,
                  draft_expert_s=5e-3, verify_expert_s=5e-2, expert_fraction=0.125)]


@pytest.fixture(scope="module")
def dynamic():
    from ablations.backends.vllm.launch.runtime import hide_media_wheels

    with contextlib.suppress(RuntimeError):
        hide_media_wheels()
    pytest.importorskip("vllm")
    from vllm.v1.spec_decode.dynamic import utils

    return utils


def schedules():
    for mode in ("off", "on", "k0"):
        for profile in ("flat", "decaying"):
            yield policy(DraftLengthConfig(mode=mode, profile=profile))
    for cost in COSTS:
        for profile in ("flat", "decaying"):
            yield choose_schedule(cost, profile_alphas(profile, 8), max_k=8, max_batch_size=512)
    yield policy(DraftLengthConfig(mode="on", schedule=((1, 3, 4), (4, 9, 2), (10, 64, 0))))


def test_every_schedule_passes_vllms_validator_and_lookup(dynamic):
    for schedule in schedules():
        as_given = [list(entry) for entry in schedule]
        assert dynamic.validate_and_normalize_dynamic_sd_schedule(as_given) == list(schedule)
        max_k = max(k for _, _, k in schedule)
        if max_k == 0:
            continue   # k0: no speculative config at all
        dense = dynamic.build_dynamic_sd_schedule_lookup(as_given, vllm_max_batch_size=1024,
                                                         vllm_num_speculative_tokens=max_k)
        assert dense[1:] == [k_for_batch(schedule, b) for b in range(1, 1025)]


def test_vllm_rejects_what_check_schedule_rejects(dynamic):
    for bad in ([], [[2, 3, 1]], [[1, 4, -1]], [[1, 3, 1], [3, 6, 1]], [[1, 0, 1]]):
        with pytest.raises(ValueError):
            dynamic.validate_and_normalize_dynamic_sd_schedule(bad)


def test_the_cumulative_rates_pass_vllms_synthetic_sampling_checks(dynamic):
    from vllm.config.speculative import SpeculativeConfig

    for config in (DraftLengthConfig(profile="flat"), DraftLengthConfig(profile="decaying"),
                   DraftLengthConfig(alphas=(0.9, 0.0, 1.0, 0.5), max_k=4)):
        rates = list(to_cumulative(config_alphas(config, 4)))
        assert SpeculativeConfig._resolve_synthetic_acceptance_rates(4, rates, None) == rates
