"""The aiter_mla toggle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig


@dataclass(frozen=True)
class AiterMLAConfig(ToggleConfig):
    """off: the generic gather-then-attend decode. on: the specialized decode, `on_backend` picks which one.

    on_backend: "auto" (AITER's mla_decode_fwd on ROCm with amd-aiter installed, else split_kv),
    "split_kv" (the portable PyTorch split-KV decode everywhere) or "aiter" (AITER, an error where absent).
    tile_tokens / stage_bytes: split_kv's tiling; 0 takes the device default (see split_kv.default_tiling).
    """

    ON_BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "split_kv", "aiter")
    on_backend: str = "auto"
    tile_tokens: int = 0
    stage_bytes: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on_backend not in self.ON_BACKENDS:
            raise ValueError(f"AiterMLAConfig.on_backend: invalid value {self.on_backend!r}; "
                             f"valid choices: {', '.join(self.ON_BACKENDS)}")
        for name in ("tile_tokens", "stage_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"AiterMLAConfig.{name}: invalid value {value!r}; "
                                 "must be an int >= 0 (0 = the device default)")
