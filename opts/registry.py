"""The one place that lists the optimizations: name -> Optimization."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from opts import aiter_mla, cache_retention, draft_length, fusion, kda_overlap, moe_dedup
from opts.base import Optimization, ToggleConfig
from opts.vllm_setting import VllmSetting, check_platform

OPTIMIZATIONS: dict[str, Optimization] = {
    opt.name: opt for opt in (aiter_mla.OPTIMIZATION, kda_overlap.OPTIMIZATION, fusion.OPTIMIZATION,
                               cache_retention.OPTIMIZATION, moe_dedup.OPTIMIZATION, draft_length.OPTIMIZATION)
}


def names() -> list[str]:
    """Registered optimization names, in registry order."""
    return list(OPTIMIZATIONS)


def get(name: str) -> Optimization:
    """The optimization called `name`; an unknown name is an error listing the valid ones."""
    try:
        return OPTIMIZATIONS[name]
    except KeyError:
        raise ValueError(f"unknown optimization {name!r}; valid choices: {', '.join(OPTIMIZATIONS)}") from None


def make_config(name: str, **values: Any) -> ToggleConfig:
    """A validated config for optimization `name`, e.g. make_config("aiter_mla", mode="on")."""
    return get(name).config(**values)


def parse_vector(raw: dict[str, Any], where: str = "toggles") -> dict[str, ToggleConfig]:
    """A toggle vector {name: {field: value}} as validated configs; an unknown name or field is an error."""
    unknown = sorted(set(raw) - set(OPTIMIZATIONS))
    if unknown:
        raise ValueError(f"{where}: unknown optimization(s) {', '.join(unknown)}; valid choices: "
                         f"{', '.join(OPTIMIZATIONS)}")
    vector = {}
    for name, values in raw.items():
        if isinstance(values, ToggleConfig):
            vector[name] = values
            continue
        if not isinstance(values, dict):
            raise ValueError(f"{where}.{name}: expected a mapping of fields (e.g. {{'mode': 'on'}}), got {values!r}")
        vector[name] = make_config(name, **values)
    return vector


def vector_dict(vector: dict[str, ToggleConfig]) -> dict[str, dict[str, Any]]:
    """A toggle vector as plain data (what travels in vLLM's additional_config), fields in declaration order."""
    return {name: {f.name: _plain(getattr(config, f.name)) for f in fields(config)} for name, config in vector.items()}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def vllm_settings(vector: dict[str, ToggleConfig], platform: str) -> dict[str, VllmSetting]:
    """What each toggle of `vector` changes in vLLM on `platform`, in registry order."""
    check_platform(platform)
    return {name: get(name).vllm_setting(vector[name], platform) for name in OPTIMIZATIONS if name in vector}
