"""How the aiter_mla toggle reaches vLLM, per platform (README.md "In vLLM" cites the vLLM 0.32 lines).

- cpu: stock vLLM-CPU decodes MLA with CPU_MLA, whose `CPUMLAImpl.forward_mqa` calls the kernel `on` runs
  (`cpu_kernel.py`): on is stock. Off replaces that forward_mqa by `naive.latent_decode`, the portable split-KV.
- rocm (data, unexecuted here): stock picks TRITON_MLA (AITER is off by default): off is stock. On is the
  environment that makes vLLM pick ROCM_AITER_MLA (AITER's `mla_decode_fwd`).
- cuda: stock picks a vendor MLA backend (FlashAttention MLA, FlashMLA, FlashInfer, CUTLASS), none of them this
  package's on, so no mode is stock there. Off selects TRITON_MLA with an engine argument (data, unexecuted);
  on is not wired (no vendor decode here for NVIDIA).
"""

from __future__ import annotations

from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.dispatch import NO_VENDOR_KERNEL, off_tiling
from opts.aiter_mla.in_vllm import portable_forward_mqa
from opts.vllm_setting import Patch, VllmSetting, check_platform, not_wired

NAME = "aiter_mla"
STOCK_MODES = {"cpu": "on", "rocm": "off"}
ON_BACKEND = {"cpu": "vllm_cpu", "rocm": "aiter"}
CPU_DECODE = "vllm.v1.attention.backends.mla.cpu_mla:CPUMLAImpl.forward_mqa"
COUNTER = "aiter_mla_portable_decode"
ROCM_ON_ENV = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1"}
CUDA_OFF_ARGS = {"attention_backend": "TRITON_MLA"}


def _valid(platform: str) -> tuple[str, ...]:
    return {"cpu": ("off", "on"), "rocm": ("off", "on"), "cuda": ("off",)}[platform]


def vllm_setting(config: AiterMLAConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform` (tile_tokens / stage_bytes matter only to off on the CPU)."""
    check_platform(platform)
    if config.mode == "on":
        if platform == "cuda":
            raise not_wired(NAME, "on", platform, NO_VENDOR_KERNEL, _valid(platform))
        if config.on_backend not in ("auto", ON_BACKEND[platform]):
            raise not_wired(NAME, f"on (on_backend={config.on_backend})", platform,
                            f"vLLM's vendor MLA decode on {platform} is {ON_BACKEND[platform]!r}",
                            ("off", "on with on_backend auto or " + ON_BACKEND[platform]))
        return VllmSetting(env=dict(ROCM_ON_ENV)) if platform == "rocm" else VllmSetting()
    if platform == "rocm":
        return VllmSetting()
    if platform == "cuda":
        return VllmSetting(engine_args=dict(CUDA_OFF_ARGS))
    patch = Patch(CPU_DECODE, lambda _stock: portable_forward_mqa(off_tiling(config, "cpu")),
                  "aiter_mla=off: CPU_MLA's decode runs the portable split-KV (naive.latent_decode) instead of "
                  "vLLM-CPU's mla_decode_kvcache", COUNTER)
    return VllmSetting(patches=(patch,))
