"""The simulator backend's own checks of an app config, and the toggles it can switch (what `ablations/config.py`
asks of a backend by its schema's `VALIDATOR`, so that the app's config imports schemas only)."""

from __future__ import annotations

from typing import Any

from ablations.backends.sim.cell import settings, unmodelled
from opts.base import ToggleConfig
from opts.registry import OPTIMIZATIONS, make_config


def validate(app: Any, vector: dict[str, ToggleConfig]) -> None:
    """Raise ValueError for the first toggle whose mode the simulator does not model on the app's platform."""
    problems = unmodelled(vector, app.hardware.platform)
    if problems:
        raise ValueError(problems[0])


def wired(platform: str, ablation: Any = None, **_context: Any) -> tuple[str, ...]:
    """The toggles whose on and off modes (`ablation.on` / `ablation.off`, default on / off) the simulator both
    models on `platform`, with different settings."""
    ablation = ablation or {}
    out = []
    for name in OPTIMIZATIONS:
        modes = (ablation.get("on", {}).get(name, "on"), ablation.get("off", {}).get(name, "off"))
        try:
            on, off = (settings({name: make_config(name, mode=mode)}, platform)[name] for mode in modes)
        except ValueError:
            continue
        if on != off:
            out.append(name)
    return tuple(out)
