"""moe_dedup's toggle: which ranks do the latent-MoE tail's up-projection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig


@dataclass(frozen=True)
class MoeDedupConfig(ToggleConfig):
    """off: after the latent all-reduce every tensor-parallel rank runs the full replicated 3584->7168
    up-projection (the shared experts' output reduced on its own). on: each rank up-projects only its 7168/TP
    hidden shard into its shared-expert partial, then one final all-reduce (vLLM's AMD K3 path). sp: sequence-
    parallel MoE, tokens split across ranks and gathered at the end (vLLM's NVIDIA K3 path only). tiered: vLLM's
    NVIDIA/CPU choice by token count, off up to `tier_threshold` tokens per step and on above.
    """

    MODES: ClassVar[tuple[str, ...]] = ("off", "on", "sp", "tiered")
    mode: str = "off"
    tier_threshold: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        t = self.tier_threshold
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"MoeDedupConfig.tier_threshold: invalid value {t!r}; valid: an integer >= 0 "
                             "(tokens per step up to which tiered runs off)")

    def is_sharded(self, num_tokens: int) -> bool:
        """Whether a step of `num_tokens` tokens runs the sharded tail (on)."""
        return self.mode == "on" or (self.mode == "tiered" and num_tokens > self.tier_threshold)
