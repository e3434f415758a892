"""draft_length's toggle: how many MTP draft tokens a decoding step proposes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig

PROFILES = ("flat", "decaying")
SAMPLING = ("synthetic", "standard")
COST_FIELDS = ("draft_pass_s", "draft_token_s", "draft_expert_s", "verify_pass_s", "verify_token_s", "verify_expert_s")


def _bad(name: str, value, valid: str) -> ValueError:
    return ValueError(f"DraftLengthConfig.{name}: invalid value {value!r}; valid: {valid}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class DraftLengthConfig(ToggleConfig):
    """off: a fixed `k` draft tokens per step. on: the K per batch-size bucket that maximizes expected accepted
    tokens per second (at most `max_k`), from the acceptance profile and the step-cost model. k0: no speculation.

    `profile`: the acceptance profile the chooser (and vLLM's synthetic rejection sampling) uses: "flat"
    (alpha_j = 0.8) or "decaying" (alpha_j = 0.9 * 0.85^(j-1)); `alphas`, when given, are the per-position
    conditional rates instead. `sampling`: "synthetic" (vLLM accepts drafts at the profile's rates: throughput
    cells comparable across cells) or "standard" (real rejection sampling: correctness). `schedule`: explicit
    [(lo, hi, K), ...] batch-size buckets for on instead of the chooser's. The cost fields are the step cost model
    c(b, K) = K (draft_pass_s + draft_token_s b + draft_expert_s F(b)) + verify_pass_s + verify_token_s b (K + 1)
    + verify_expert_s F(b (K + 1)), F(t) = 1 - (1 - expert_fraction)^t the share of routed experts t tokens touch
    (expert_fraction = experts per token / experts); defaults: the fit measured on the CPU stack (README.md).
    """

    MODES: ClassVar[tuple[str, ...]] = ("off", "on", "k0")
    mode: str = "off"
    k: int = 3
    max_k: int = 8
    profile: str = "flat"
    alphas: tuple[float, ...] = ()
    sampling: str = "synthetic"
    schedule: tuple[tuple[int, int, int], ...] = ()
    draft_pass_s: float = 3.143e-03
    draft_token_s: float = 4.628e-04
    draft_expert_s: float = 1.054e-02
    verify_pass_s: float = 1.793e-02
    verify_token_s: float = 1.312e-03
    verify_expert_s: float = 6.437e-02
    expert_fraction: float = 0.125

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "alphas", tuple(self.alphas))
        object.__setattr__(self, "schedule", tuple(tuple(e) if isinstance(e, list | tuple) else e
                                                   for e in self.schedule))
        if not _is_int(self.k) or self.k < 1:
            raise _bad("k", self.k, "an integer >= 1 (the fixed draft length of off; k0 is its own mode)")
        if not _is_int(self.max_k) or self.max_k < 1:
            raise _bad("max_k", self.max_k, "an integer >= 1")
        if self.profile not in PROFILES:
            raise _bad("profile", self.profile, ", ".join(PROFILES))
        for i, a in enumerate(self.alphas):
            if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1:
                raise _bad(f"alphas[{i}]", a, "a conditional acceptance rate in [0, 1]")
        if self.sampling not in SAMPLING:
            raise _bad("sampling", self.sampling, ", ".join(SAMPLING))
        for name in COST_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    value >= 0 and math.isfinite(value)):
                raise _bad(name, value, "seconds >= 0")
        if isinstance(self.expert_fraction, bool) or not isinstance(self.expert_fraction, int | float) or not (
                0 < self.expert_fraction <= 1):
            raise _bad("expert_fraction", self.expert_fraction, "a share of experts in (0, 1]")
        if (self.draft_pass_s + self.draft_token_s + self.draft_expert_s <= 0
                or self.verify_pass_s + self.verify_token_s + self.verify_expert_s <= 0):
            raise _bad("cost", {n: getattr(self, n) for n in COST_FIELDS}, "draft and verify passes that cost time")
        previous_hi = 0
        for i, entry in enumerate(self.schedule):
            if not (isinstance(entry, tuple) and len(entry) == 3 and all(_is_int(v) for v in entry)):
                raise _bad(f"schedule[{i}]", entry, "[lo, hi, K] integers")
            lo, hi, k = entry
            if lo != previous_hi + 1 or hi < lo or k < 0 or k > self.max_k:
                raise _bad(f"schedule[{i}]", list(entry), f"lo = {previous_hi + 1} (buckets start at batch size 1 "
                           f"and follow each other), hi >= lo, 0 <= K <= max_k ({self.max_k})")
            previous_hi = hi

    @property
    def is_speculative(self) -> bool:
        return self.mode != "k0"
