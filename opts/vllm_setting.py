"""How one toggle setting reaches vLLM, as data: the record each package's `vllm.py` returns.

`vllm.py` imports nothing from `ablations` (and vLLM only inside its wrappers); the backend's patch layer
(`ablations/backends/vllm/in_vllm/patches.py`) installs the patches, the engine builder applies the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PLATFORMS = ("cpu", "rocm", "cuda")
# vLLM 0.32's K3 code that several packages and the backend's CPU fixes patch, named once.
K3_VLLM = "vllm.models.kimi_k3.nvidia"
KDA_OPS = f"{K3_VLLM}.ops.third_party.kda"
KDA_FORWARD = f"{K3_VLLM}.kda:KimiK3DeltaAttention._forward"


@dataclass(frozen=True)
class Patch:
    """Set `target` ("module:attr" or "module:Class.attr") to `wrap(current value)`; `why` names the reason
    (a CPU fix's S-number, or the toggle). With `counter`, calls of the replacement are counted under it.
    `idle_with`: (condition, why) pairs, a condition being an engine argument ("speculative_config": the engine
    is given it) or its absence ("!tensor_parallel_size"): such an engine never runs this route, so its counter
    stays 0 by design (a cell checks that every other counted route fired)."""

    target: str
    wrap: Callable[[Any], Any] = field(compare=False)
    why: str
    counter: str | None = None
    idle_with: tuple[tuple[str, str], ...] = ()

    def idle_in(self, engine_args: dict[str, Any]) -> str | None:
        """Why an engine with `engine_args` never runs this route, or None."""
        for condition, why in self.idle_with:
            name = condition.removeprefix("!")
            if (name in engine_args) != condition.startswith("!"):
                return why
        return None

    def __post_init__(self) -> None:
        module, sep, path = self.target.partition(":")
        if not (module and sep and path):
            raise ValueError(f"Patch.target: invalid value {self.target!r}; expected 'module:attr' or "
                             "'module:Class.attr'")
        if not self.why.strip():
            raise ValueError(f"Patch.why: empty for {self.target!r}; say what the patch fixes or switches")


@dataclass(frozen=True)
class VllmSetting:
    """What one toggle setting changes in a vLLM engine on one platform.

    `engine_args`: keyword arguments of `vllm.LLM` / `EngineArgs`; `env`: environment of every vLLM process;
    `additional_config`: entries merged into vLLM's `additional_config`; `patches`: installed in every vLLM
    process that builds a worker. An empty setting is stock vLLM.
    """

    engine_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    additional_config: dict[str, Any] = field(default_factory=dict)
    patches: tuple[Patch, ...] = ()

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.env.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise ValueError(f"VllmSetting.env: values must be strings, got {bad!r}")
        object.__setattr__(self, "patches", tuple(self.patches))

    @property
    def is_stock(self) -> bool:
        """Whether this setting leaves vLLM as it is."""
        return not (self.engine_args or self.env or self.additional_config or self.patches)


def check_platform(platform: str) -> None:
    """Raise ValueError for a platform name outside PLATFORMS."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform: invalid value {platform!r}; valid choices: {', '.join(PLATFORMS)}")


def not_wired(name: str, mode: str, platform: str, why: str, valid: tuple[str, ...]) -> ValueError:
    """The error for a cell (toggle, mode, platform) that vLLM cannot run."""
    return ValueError(f"{name}={mode} on {platform}: {why}; valid there: {', '.join(valid) or 'none'}")
