"""The vLLM backend's own checks of an app config, and the toggles it can switch (what `ablations/config.py` asks of
a backend by its schema's `VALIDATOR`, so that the app's config imports schemas only)."""

from __future__ import annotations

from typing import Any

from ablations.backends.vllm.cells.commands import node_config
from ablations.backends.vllm.config import FULL_SIZE_MODELS, SIM_ONLY_MODELS
from ablations.backends.vllm.launch.engine import engine_config, engine_kwargs
from opts.base import ToggleConfig
from opts.registry import OPTIMIZATIONS, vector_dict
from opts.vllm_setting import VllmSetting


def validate(app: Any, vector: dict[str, ToggleConfig]) -> None:
    """Raise ValueError when vLLM cannot serve the app's model with its vector: a simulator-only model, a full-size
    model without its checkpoint, or an engine (or, with `print_commands`, a GPU node's commands) that cannot be
    built."""
    if app.model.name in SIM_ONLY_MODELS:
        raise ValueError(f"model: {app.model.name!r} is modelled only by the simulator; valid: backend=sim, or "
                         f"a model vLLM serves here ({', '.join(n for n in ('k3_tiny', *FULL_SIZE_MODELS))})")
    if app.model.name in FULL_SIZE_MODELS and not app.model.checkpoint:
        raise ValueError(f"model.checkpoint: empty; {app.model.name} is served from its checkpoint: valid: "
                         "model.checkpoint=<local directory or Hugging Face id>, or $K3_CHECKPOINT")
    if app.backend.print_commands:    # checked on the node it prints for
        node_config(app.backend, app.model, app.hardware, vector_dict(vector))
    else:
        engine_config(app.backend, app.model, vector_dict(vector), app.paths.model_cache)


def wired(platform: str, ablation: Any = None, *, backend: Any, model: Any, opts: dict[str, Any],
          **_context: Any) -> tuple[str, ...]:
    """The toggles whose on and off vectors (the other toggles as `opts` has them) both make a valid engine, differ
    there, and act in that engine (a setting whose every route is idle there, such as moe_dedup's tail at
    tensor-parallel size 1, does not)."""
    ablation = ablation or {}
    out = []
    for name in OPTIMIZATIONS:
        found, acting = [], False
        for mode in (ablation.get("on", {}).get(name, "on"), ablation.get("off", {}).get(name, "off")):
            vector = {**opts, name: {**opts[name], "mode": mode}}
            try:
                engine = engine_config(backend, model, vector)
            except ValueError:
                break
            found.append(engine.settings()[name])
            acting = acting or acts(found[-1], engine_kwargs(engine))
        if len(found) == 2 and found[0] != found[1] and acting:
            out.append(name)
    return tuple(out)


def acts(setting: VllmSetting, engine_args: dict[str, Any]) -> bool:
    """Whether a toggle's setting changes anything an engine with `engine_args` runs."""
    return bool(setting.engine_args or setting.env or setting.additional_config) or any(
        p.counter is None or p.idle_in(engine_args) is None for p in setting.patches)
