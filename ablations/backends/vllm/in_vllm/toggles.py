"""The toggle vector inside vLLM: read from `additional_config["k3_ablate"]` when a worker or a scheduler is
built (it and its block pool live in the engine core's process, the model in the worker's), installed
as the patches each optimization's `vllm.py` asks for, and recorded per process.

A process serves one vector: a second, different vector in the same process is an error (its patches would
stack on the first one's).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

from ablations.backends.vllm.in_vllm.counters import counter_dir
from ablations.backends.vllm.in_vllm.patches import Patch, after_init, install_all, installed
from opts.base import ToggleConfig
from opts.registry import parse_vector, vector_dict, vllm_settings

CONFIG_KEY = "k3_ablate"
WORKER_INIT = "vllm.v1.worker.worker_base:WorkerBase.__init__"
# Not EngineCore.__init__: the engine core loads the plugins inside it; the scheduler comes after.
SCHEDULER_INIT = "vllm.v1.core.sched.scheduler:Scheduler.__init__"
RECORD_SUFFIX = ".patches.json"

_active: dict[str, dict[str, Any]] | None = None


def platform_name() -> str:
    """This process's vLLM platform as one of opts.vllm_setting.PLATFORMS."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu"
    if current_platform.is_rocm():
        return "rocm"
    if current_platform.is_cuda():
        return "cuda"
    raise RuntimeError(f"k3-ablate: no toggle wiring for vLLM platform {current_platform.device_name!r}")


def toggle_patches(vector: dict[str, ToggleConfig], platform: str) -> list[Patch]:
    """Every patch the vector's settings ask for on `platform`, in registry order."""
    return [patch for setting in vllm_settings(vector, platform).values() for patch in setting.patches]


def install_vector(raw: dict[str, Any], platform: str) -> None:
    """Validate the vector `raw` (the additional_config entry) and install its patches; idempotent per process."""
    global _active
    vector = parse_vector(raw, f"additional_config.{CONFIG_KEY}")
    data = vector_dict(vector)
    if _active is not None and _active != data:
        raise RuntimeError(f"k3-ablate: this process already serves toggle vector {_active}; it cannot switch "
                           f"to {data} (start a new engine process)")
    install_all(toggle_patches(vector, platform))
    _active = data
    write_record()


def install_from_config(vllm_config: Any) -> None:
    """Install the vector `vllm_config` carries, if any."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    raw = extra.get(CONFIG_KEY)
    if raw is not None:
        install_vector(raw, platform_name())


def install_from_worker(worker: Any) -> None:
    """After `WorkerBase.__init__`: install the vector the worker's config carries, if any."""
    install_from_config(worker.vllm_config)


def before_scheduler(base_init: Any) -> Any:
    """Wrap `Scheduler.__init__`: install the vector before the scheduler builds its KV-cache manager."""

    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        install_from_config(vllm_config)
        base_init(self, vllm_config, *args, **kwargs)

    __init__.__wrapped__ = base_init  # type: ignore[attr-defined]
    return __init__


WHY = f"reads the toggle vector from additional_config[{CONFIG_KEY!r}] and installs its patches"
WORKER_PATCH = Patch(WORKER_INIT, after_init(install_from_worker), WHY)
SCHEDULER_PATCH = Patch(SCHEDULER_INIT, before_scheduler, f"{WHY} (the scheduler's process)")


def active_vector() -> dict[str, dict[str, Any]] | None:
    """The vector installed in this process, as plain data, or None."""
    return _active


def write_record() -> None:
    """Write `<counter dir>/<pid>.patches.json`: this process's vector and installed patches (no-op without
    K3_ABLATE_COUNTER_DIR)."""
    directory = counter_dir()
    if directory is None:
        return
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "pid": os.getpid(),
        "process": multiprocessing.current_process().name,
        "toggles": _active,
        "patches": [{"target": p.target, "why": p.why, "counter": p.counter} for p in installed()],
    }
    tmp = directory / f".{os.getpid()}.patches.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(directory / f"{os.getpid()}{RECORD_SUFFIX}")


def read_records(directory: str | Path) -> list[dict[str, Any]]:
    """The patch records of every vLLM process that wrote into `directory`, by pid."""
    paths = sorted(Path(directory).glob(f"*{RECORD_SUFFIX}"), key=lambda p: int(p.name.split(".")[0]))
    return [json.loads(p.read_text()) for p in paths]
