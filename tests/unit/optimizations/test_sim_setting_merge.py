"""SimSetting.merged: what the simulator reads of a toggle vector, field by field, whatever toggle set it."""

from __future__ import annotations

import pytest

from opts.fusion.sim import fused_kda_decode, fused_mla_norm
from opts.registry import OPTIMIZATIONS, make_config
from opts.sim_setting import SimSetting


def test_fields_merge_by_kind() -> None:
    a = SimSetting(kernel_classes={"mla_decode": "attention_vendor"}, packed_kda=True,
                   fused={"kda_decode": fused_kda_decode})
    b = SimSetting(kernel_classes={"mtp_mla_decode": "attention_vendor"},
                   fused={"mla_norm": fused_mla_norm, "kda_decode": fused_kda_decode},
                   latent_up_tier=256, num_drafts=3, alphas=(0.8, 0.7))
    m = SimSetting.merged([a, b, SimSetting()])
    assert m.kernel_classes == {"mla_decode": "attention_vendor", "mtp_mla_decode": "attention_vendor"}
    assert (m.packed_kda, m.kda_streams) == (True, False)
    assert m.fused == {"kda_decode": fused_kda_decode, "mla_norm": fused_mla_norm}
    assert (m.latent_up_tier, m.num_drafts, m.alphas) == (256, 3, (0.8, 0.7))
    assert SimSetting.merged([]) == SimSetting()


def test_two_toggles_setting_one_field_two_ways_is_named() -> None:
    with pytest.raises(ValueError, match=r"SimSetting.num_drafts: set to 3 and 5 by two toggles"):
        SimSetting.merged([SimSetting(num_drafts=3), SimSetting(num_drafts=5)])
    with pytest.raises(ValueError, match=r"SimSetting.kernel_classes\['mla_decode'\]"):
        SimSetting.merged([SimSetting(kernel_classes={"mla_decode": "a"}),
                           SimSetting(kernel_classes={"mla_decode": "b"})])
    with pytest.raises(ValueError, match=r"SimSetting.fused\['kda_decode'\]"):
        SimSetting.merged([SimSetting(fused={"kda_decode": fused_kda_decode}),
                           SimSetting(fused={"kda_decode": fused_mla_norm})])
    assert SimSetting.merged([SimSetting(num_drafts=3), SimSetting(num_drafts=3)]).num_drafts == 3


def test_a_fused_stage_needs_a_known_name_and_a_pricing() -> None:
    with pytest.raises(ValueError, match=r"SimSetting.fused: invalid value .*stages kda_decode, mla_norm"):
        SimSetting(fused={"attn_res": fused_mla_norm})
    with pytest.raises(ValueError, match=r"SimSetting.fused: invalid value"):
        SimSetting(fused=("kda_decode",))


@pytest.mark.parametrize("platform", ["rocm", "cuda"])
def test_every_registered_toggle_on_merges_with_the_others(platform: str) -> None:
    # each field of the simulator's setting has one owner among the toggles: all of them on merge without a clash,
    # and each toggle's own fields come through
    own = {}
    for name, optimization in OPTIMIZATIONS.items():
        try:
            own[name] = optimization.sim_setting(make_config(name, mode="on"), platform)
        except ValueError:
            own[name] = optimization.sim_setting(make_config(name, mode="off"), platform)
    merged = SimSetting.merged(own.values())
    for setting in own.values():
        assert set(setting.kernel_classes.items()) <= set(merged.kernel_classes.items())
        assert set(setting.fused.items()) <= set(merged.fused.items())
        if setting.num_drafts is not None:
            assert merged.num_drafts == setting.num_drafts
