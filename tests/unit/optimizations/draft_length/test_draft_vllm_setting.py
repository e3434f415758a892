"""draft_length's vLLM setting: the speculative_config of each mode, the same on every platform."""

from __future__ import annotations

import pytest

from opts.draft_length import DraftLengthConfig, policy
from opts.draft_length import vllm as setting
from opts.vllm_setting import PLATFORMS


def spec(platform: str = "cpu", **fields):
    found = setting.vllm_setting(DraftLengthConfig(**fields), platform)
    return found.engine_args.get("speculative_config") if found.engine_args else None


@pytest.mark.parametrize("platform", PLATFORMS)
def test_k0_is_stock_vllm_everywhere(platform):
    assert setting.STOCK_MODES[platform] == "k0"
    assert setting.vllm_setting(DraftLengthConfig(mode="k0"), platform).is_stock


def test_off_is_a_fixed_k_with_the_profiles_cumulative_rates():
    assert spec(mode="off") == {"method": "mtp", "num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                                "synthetic_acceptance_rates": pytest.approx([0.8, 0.64, 0.512])}
    assert spec(mode="off", k=2, profile="decaying") == {
        "method": "mtp", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": pytest.approx([0.9, 0.9 * 0.9 * 0.85])}


def test_standard_sampling_leaves_vllms_rejection_sampler():
    assert spec(mode="off", sampling="standard") == {"method": "mtp", "num_speculative_tokens": 3}


def test_on_is_the_choosers_schedule_with_its_largest_k():
    config = DraftLengthConfig(mode="on")
    schedule = policy(config)
    found = spec(mode="on")
    assert found["num_speculative_tokens_per_batch_size"] == [list(e) for e in schedule]
    assert found["num_speculative_tokens"] == max(k for _, _, k in schedule)
    assert len(found["synthetic_acceptance_rates"]) == found["num_speculative_tokens"]


def test_an_explicit_schedule_and_explicit_rates_pass_through():
    found = spec(mode="on", schedule=((1, 3, 4), (4, 1024, 1)), alphas=(1.0, 0.5, 0.5, 0.5), sampling="synthetic")
    assert found["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 1024, 1]]
    assert found["num_speculative_tokens"] == 4
    assert found["synthetic_acceptance_rates"] == pytest.approx([1.0, 0.5, 0.25, 0.125])


def test_a_schedule_of_only_zeros_is_no_speculation():
    assert setting.vllm_setting(DraftLengthConfig(mode="on", schedule=((1, 1024, 0),)), "cuda").is_stock


@pytest.mark.parametrize(("fields", "match"), [
    ({"k": -1}, r"DraftLengthConfig.k: invalid value -1"),
    ({"k": 0}, r"DraftLengthConfig.k: invalid value 0; valid: .*k0 is its own mode"),
    ({"alphas": (0.5, 1.2)}, r"DraftLengthConfig.alphas\[1\]: invalid value 1.2; valid: .*\[0, 1\]"),
    ({"alphas": (-0.1,)}, r"DraftLengthConfig.alphas\[0\]: invalid value -0.1"),
    ({"mode": "on", "schedule": ((1, 3, 9),)}, r"DraftLengthConfig.schedule\[0\]: .*0 <= K <= max_k \(8\)"),
    ({"sampling": "greedy"}, r"DraftLengthConfig.sampling: invalid value 'greedy'"),
])
def test_bad_input_is_named(fields, match):
    with pytest.raises(ValueError, match=match):
        DraftLengthConfig(**fields)


def test_too_few_explicit_rates_for_k_is_named():
    with pytest.raises(ValueError, match=r"DraftLengthConfig.alphas: 2 rates cover K <= 2, got K = 3"):
        spec(mode="off", alphas=(0.9, 0.9))
