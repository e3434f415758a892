"""The CPU platform's config hook, made right for Kimi models with MLA layers.

`CpuPlatform.check_and_update_config` (platforms/cpu.py:216-530) does two things wrong here:

- it switches chunked prefill and prefix caching off for every MLA model on a CPU without AMX
  (cpu.py:516-530). With the CPU path's context gather (S7), the in-place context-chunk output (S9)
  and the block fixes (S6, S10) the K3 MLA layer handles context chunks, so for the Kimi
  architectures the user's settings are put back;
- S11: it runs again whenever a VllmConfig is rebuilt from an existing one: for each
  `VllmConfig.with_hf_config` copy (config/vllm.py:934-991; the K3 wrapper makes them in
  `get_mamba_state_{shape,dtype}_from_config`, models/kimi_k3/nvidia/model.py:2138-2148) and in the
  engine core's startup handshake (v1/engine/core.py:1311), after the KV-cache setup raised the
  block size to the hybrid-aligned 128 (v1/engine/core.py:352). Each run resets the shared
  CacheConfig's `block_size` to 16 (cpu.py:273-280). The scheduler of a multiprocess engine then
  ends prefill chunks at 16-token multiples instead of 128-token block boundaries
  (v1/core/sched/scheduler.py:443-545), the KDA state cached with a 128-token block is the state
  of a different position, and prefix-cache hits give wrong tokens without any error. Here a
  block size that is already a multiple of the MLA kernel block (16) is never lowered, and in
  "align" mode the Mamba block size follows it, as the alignment sets it (interface.py:1102).
"""

from __future__ import annotations

from ablations.backends.vllm.in_vllm.cpu.kv_blocks import MLA_KERNEL_BLOCK
from ablations.backends.vllm.in_vllm.patches import original

TARGET = "vllm.platforms.cpu:CpuPlatform.check_and_update_config"
KIMI_ARCHITECTURES = ("KimiK3ForConditionalGeneration", "KimiLinearForCausalLM")


def is_kimi(vllm_config) -> bool:
    model_config = vllm_config.model_config
    return model_config is not None and model_config.architecture in KIMI_ARCHITECTURES


def check_and_update_config(cls, vllm_config) -> None:
    base = original(TARGET).__get__(None, cls)
    if not is_kimi(vllm_config):
        base(vllm_config)
        return
    scheduler, cache = vllm_config.scheduler_config, vllm_config.cache_config
    wanted = (scheduler.enable_chunked_prefill, cache.enable_prefix_caching, scheduler.max_num_batched_tokens)
    block_size = cache.block_size
    base(vllm_config)
    scheduler.enable_chunked_prefill, cache.enable_prefix_caching = wanted[0], wanted[1]
    if wanted[0]:
        scheduler.max_num_batched_tokens = wanted[2]
    if block_size and block_size % MLA_KERNEL_BLOCK == 0 and block_size > cache.block_size:
        cache.block_size = block_size
    if cache.mamba_cache_mode == "align" and cache.mamba_block_size and cache.mamba_block_size < cache.block_size:
        cache.mamba_block_size = cache.block_size
