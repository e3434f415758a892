"""kda_overlap's toggle: how a step holding prefill chunks and verification rows runs its KDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from opts.base import ToggleConfig

CHUNK_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class KdaOverlapConfig(ToggleConfig):
    """off: verification rows recurrent, then prefill chunked (vLLM today). on: one packed chunked pass that
    keeps every verification position's state. streams: off's two parts on two GPU streams at once (CUDA/ROCm
    only). `chunk_size`: tokens per chunk of the chunked form."""

    MODES: ClassVar[tuple[str, ...]] = ("off", "on", "streams")
    mode: str = "off"
    chunk_size: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk_size not in CHUNK_SIZES:
            raise ValueError(f"KdaOverlapConfig.chunk_size: invalid value {self.chunk_size!r}; valid choices: "
                             f"{', '.join(map(str, CHUNK_SIZES))}")
