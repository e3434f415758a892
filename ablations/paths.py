"""The `paths` Hydra group's schema: where a run writes and where it finds data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PathsConfig:
    """`output_root`: the parent of every run directory (Hydra's run and sweep dirs live under it).
    `model_cache`: where tiny model directories are written ("" = K3_ABLATE_MODEL_DIR or
    ~/.cache/k3-ablate/models). Relative paths are relative to the working directory."""

    output_root: str = "outputs"
    model_cache: str = ""

    def __post_init__(self) -> None:
        if not self.output_root:
            raise ValueError("PathsConfig.output_root: empty; valid: a directory path")
