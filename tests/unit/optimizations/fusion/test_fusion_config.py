"""FusionConfig, the mechanism switch and the registry entry."""

from __future__ import annotations

import pytest

from opts import registry
from opts.fusion import (
    COUNTERFACTUAL,
    MECHANISMS,
    FusionConfig,
    implementation,
    kda_decode_slots_fused,
    kda_decode_slots_unfused,
    q_kv_rms_norm,
    q_kv_rms_norm_fused,
)
from opts.fusion.cases import bench_cases
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape


def test_config_modes_and_mechanisms():
    assert not FusionConfig().is_on
    on = FusionConfig(mode="on")
    assert all(on.is_fused(m) for m in MECHANISMS)
    partial = FusionConfig.from_dict({"mode": "on", "mechanisms": ["mla_norm"]})
    assert partial.mechanisms == ("mla_norm",)
    assert implementation(partial, "mla_norm") is q_kv_rms_norm_fused
    assert implementation(partial, "kda_decode") is kda_decode_slots_unfused
    assert implementation(FusionConfig(mode="off"), "mla_norm") is q_kv_rms_norm
    assert implementation(on, "kda_decode") is kda_decode_slots_fused


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "fused"}, r"FusionConfig.mode: invalid value 'fused'; valid choices: off, on"),
    ({"mechanisms": ["kda"]}, r"FusionConfig.mechanisms: invalid value\(s\) 'kda'; valid choices: kda_decode"),
    ({"mechanisms": "mla_norm"}, r"FusionConfig.mechanisms: expected a list of names"),
    ({"mechanisms": ["attn_res"]}, r"'attn_res' is not toggled: vLLM always runs it fused"),
    ({"level": 3}, r"FusionConfig: unknown field\(s\) level; valid fields: mechanisms, mode"),
])
def test_config_errors_name_field_value_and_choices(values, message):
    with pytest.raises(ValueError, match=message):
        FusionConfig.from_dict(values)


@pytest.mark.parametrize(("mechanism", "message"), [
    ("rope", r"unknown fusion mechanism 'rope'; valid choices: kda_decode, mla_norm"),
    ("attn_res", r"unknown fusion mechanism 'attn_res'; 'attn_res' is not toggled"),
])
def test_unknown_mechanism_is_an_error(mechanism, message):
    with pytest.raises(ValueError, match=message):
        implementation(FusionConfig(mode="on"), mechanism)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: KdaDecodeShape(0), r"KdaDecodeShape.num_tokens: invalid value 0"),
    (lambda: KdaDecodeShape(1, conv_width=1), r"KdaDecodeShape.conv_width: invalid value 1"),
    (lambda: MlaNormShape(4, rope_dim=-1), r"MlaNormShape.rope_dim: invalid value -1"),
    (lambda: AttnResShape(4, 9), r"AttnResShape.num_blocks: invalid value 9; valid: 0..8"),
    (lambda: AttnResShape(4, 8, block_write=True), r"AttnResShape.num_blocks: invalid value 8; valid: 0..7"),
])
def test_shape_errors_name_field_and_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_registered_with_k3_cases():
    assert registry.get("fusion").config_cls is FusionConfig
    assert isinstance(registry.make_config("fusion", mode="on"), FusionConfig)
    quick, full = bench_cases(True, "cpu"), bench_cases(False, "cpu")
    names = [c.name for c in full]
    assert len(set(names)) == len(names)
    assert {c.name for c in quick} < set(names)
    assert {c.info["mechanism"] for c in quick} == set(MECHANISMS) | set(COUNTERFACTUAL)
    for case in full:
        counterfactual = case.info["mechanism"] in COUNTERFACTUAL
        assert case.info["counterfactual"] is counterfactual, case.name
        assert case.name.endswith("_counterfactual") is counterfactual, case.name
        assert case.atol >= 0 and case.rtol > 0, case.name
    kda = next(c for c in full if c.info["mechanism"] == "kda_decode")
    assert (kda.info["num_heads"], kda.info["head_dim"], kda.info["conv_width"]) == (12, 128, 4)
    mla = next(c for c in full if c.info["mechanism"] == "mla_norm")
    assert (mla.info["q_lora_rank"], mla.info["kv_lora_rank"], mla.info["rope_dim"]) == (1536, 512, 64)
    attn = next(c for c in full if c.info["mechanism"] == "attn_res")
    assert attn.info["hidden"] == 7168
