"""The one place that lists the optimizations: name -> Optimization."""

from __future__ import annotations

from typing import Any

from opts import aiter_mla, fusion, kda_overlap
from opts.base import Optimization, ToggleConfig

OPTIMIZATIONS: dict[str, Optimization] = {
    opt.name: opt for opt in (aiter_mla.OPTIMIZATION, kda_overlap.OPTIMIZATION, fusion.OPTIMIZATION)
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
