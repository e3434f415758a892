"""FusionConfig, the mechanism switch and the registry entry."""

from __future__ import annotations

import pytest

from opts import registry
from opts.fusion import (
    MECHANISMS,
    FusionConfig,
    attn_res_fused,
    attn_res_unfused,
    implementation,
    kda_decode_fused,
    mla_norm_unfused,
)
from opts.fusion.cases import bench_cases
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape


def test_config_modes_and_mechanisms():
    assert not FusionConfig().is_on
    on = FusionConfig(mode="on")
    assert all(on.is_fused(m) for m in MECHANISMS)
    partial = FusionConfig.from_dict({"mode": "on", "mechanisms": ["attn_res"]})
    assert partial.mechanisms == ("attn_res",)
    assert implementation(partial, "attn_res") is attn_res_fused
    assert implementation(partial, "mla_norm") is mla_norm_unfused
    assert implementation(FusionConfig(mode="off"), "attn_res") is attn_res_unfused
    assert implementation(on, "kda_decode") is kda_decode_fused


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "fused"}, r"FusionConfig.mode: invalid value 'fused'; valid choices: off, on"),
    ({"mechanisms": ["kda"]}, r"FusionConfig.mechanisms: invalid value\(s\) 'kda'; valid choices: kda_decode"),
    ({"mechanisms": "attn_res"}, r"FusionConfig.mechanisms: expected a list of names"),
    ({"level": 3}, r"FusionConfig: unknown field\(s\) level; valid fields: mechanisms, mode"),
])
def test_config_errors_name_field_value_and_choices(values, message):
    with pytest.raises(ValueError, match=message):
        FusionConfig.from_dict(values)


def test_unknown_mechanism_is_an_error():
    with pytest.raises(ValueError, match="unknown fusion mechanism 'rope'"):
        implementation(FusionConfig(mode="on"), "rope")


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
    assert {c.info["mechanism"] for c in quick} == set(MECHANISMS)
    kda = next(c for c in full if c.info["mechanism"] == "kda_decode")
    assert (kda.info["num_heads"], kda.info["head_dim"], kda.info["conv_width"]) == (12, 128, 4)
    mla = next(c for c in full if c.info["mechanism"] == "mla_norm")
    assert (mla.info["q_lora_rank"], mla.info["kv_lora_rank"], mla.info["rope_dim"]) == (1536, 512, 64)
    attn = next(c for c in full if c.info["mechanism"] == "attn_res")
    assert attn.info["hidden"] == 7168
