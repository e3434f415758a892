"""The `fusion` toggle's config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig

MECHANISMS: tuple[str, ...] = ("kda_decode", "mla_norm")
# Measured beside the toggle, never switched by it: stock vLLM has no unfused path for these.
COUNTERFACTUAL: tuple[str, ...] = ("attn_res",)


def _unknown(mechanism: str) -> str:
    if mechanism in COUNTERFACTUAL:
        return (f"{mechanism!r} is not toggled: vLLM always runs it fused (opts.fusion.attn_res_fused); its "
                f"unfused form is a counterfactual; valid choices: {', '.join(MECHANISMS)}")
    return f"valid choices: {', '.join(MECHANISMS)}"


@dataclass(frozen=True)
class FusionConfig(ToggleConfig):
    """`mode` off: vLLM's separate passes, each compiled like the fused one; on: one fused pass per mechanism.

    `mechanisms` picks which fused passes "on" applies (all by default).
    """

    MODES: ClassVar[tuple[str, ...]] = ("off", "on")
    mechanisms: tuple[str, ...] = MECHANISMS

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.mechanisms, str) or not all(isinstance(m, str) for m in self.mechanisms):
            raise ValueError(f"FusionConfig.mechanisms: expected a list of names, got {self.mechanisms!r}; "
                             f"valid choices: {', '.join(MECHANISMS)}")
        object.__setattr__(self, "mechanisms", tuple(self.mechanisms))
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown:
            raise ValueError(f"FusionConfig.mechanisms: invalid value(s) {', '.join(map(repr, unknown))}; "
                             f"{_unknown(unknown[0])}")

    def is_fused(self, mechanism: str) -> bool:
        """Whether `mechanism` runs as its fused pass under this config."""
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown fusion mechanism {mechanism!r}; {_unknown(mechanism)}")
        return self.is_on and mechanism in self.mechanisms
