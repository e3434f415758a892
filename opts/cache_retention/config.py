"""cache_retention's toggle: which retention policy the hybrid prefix cache runs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig

RESUME_FROM = ("turn_end", "prompt_tail")


@dataclass(frozen=True)
class CacheRetentionConfig(ToggleConfig):
    """off: vLLM's prefix caching (align mode, LRU of free blocks). evict: session-aware eviction order.
    resume: a turn's KDA state and partial last block kept for the session's next turn. on: both.

    `idle_s`: a session with nothing running for this long after its last finish counts as idle (evict).
    `resume_from`: "turn_end" keeps the state after the turn's last computed token (prompt and answer);
    "prompt_tail" keeps it at the prompt's end, rounded down to `resume_unit` tokens (what vLLM 0.32 itself
    can do, with `prefix_match_unit`). `resume_unit`: 1 for turn_end.
    """

    MODES: ClassVar[tuple[str, ...]] = ("off", "on", "evict", "resume")
    mode: str = "off"
    idle_s: float = 30.0
    resume_from: str = "turn_end"
    resume_unit: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.idle_s, bool) or not isinstance(self.idle_s, int | float) or not (
                self.idle_s > 0 and math.isfinite(self.idle_s)):
            raise ValueError(f"CacheRetentionConfig.idle_s: invalid value {self.idle_s!r}; valid: seconds > 0")
        if self.resume_from not in RESUME_FROM:
            raise ValueError(f"CacheRetentionConfig.resume_from: invalid value {self.resume_from!r}; valid "
                             f"choices: {', '.join(RESUME_FROM)}")
        if isinstance(self.resume_unit, bool) or not isinstance(self.resume_unit, int) or self.resume_unit < 1:
            raise ValueError(f"CacheRetentionConfig.resume_unit: invalid value {self.resume_unit!r}; valid: an "
                             "integer >= 1")
        if self.resume_from == "turn_end" and self.resume_unit != 1:
            raise ValueError(f"CacheRetentionConfig.resume_unit: invalid value {self.resume_unit!r} with "
                             "resume_from='turn_end'; valid: 1 (a turn resumes at its exact end)")

    @property
    def is_evict(self) -> bool:
        return self.mode in ("on", "evict")

    @property
    def is_resume(self) -> bool:
        return self.mode in ("on", "resume")
