"""AiterMLAConfig: validated, errors name the field, the value and the valid choices."""

from __future__ import annotations

import pytest

from opts.aiter_mla import AiterMLAConfig


def test_defaults_and_modes() -> None:
    assert AiterMLAConfig().mode == "off" and not AiterMLAConfig().is_on
    on = AiterMLAConfig(mode="on", on_backend="vllm_cpu", tile_tokens=512, stage_bytes=1 << 20)
    assert on.is_on and on.on_backend == "vllm_cpu"


@pytest.mark.parametrize(("values", "message"), [
    ({"mode": "fast"}, r"AiterMLAConfig.mode: invalid value 'fast'; valid choices: off, on"),
    ({"on_backend": "triton"},
     r"AiterMLAConfig.on_backend: invalid value 'triton'; valid choices: auto, vllm_cpu, aiter"),
    ({"tile_tokens": -1}, r"AiterMLAConfig.tile_tokens: invalid value -1"),
    ({"stage_bytes": 1.5}, r"AiterMLAConfig.stage_bytes: invalid value 1.5"),
    ({"tile": 4}, r"AiterMLAConfig: unknown field\(s\) tile; valid fields: mode, on_backend, stage_bytes, tile_tokens"),
])
def test_invalid_values_are_named(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AiterMLAConfig.from_dict(values)
