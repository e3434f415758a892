"""`platform.check_and_update_config` around vLLM's own `CpuPlatform.check_and_update_config` (platforms/cpu.py:216):
on a CPU without AMX vLLM forces block 16 for MLA (:273-280) and switches chunked prefill and prefix caching off
(:516-530); for the Kimi architectures the user's settings come back and an aligned block is never lowered."""

from __future__ import annotations

import os
import types

import pytest
import torch

from ablations.backends.vllm.in_vllm import patches as patching
from ablations.backends.vllm.in_vllm.cpu import platform


@pytest.fixture
def cpu_platform(vllm, monkeypatch):
    """vLLM's CpuPlatform with its own hook as the wrapped original, no AMX, os.environ restored afterwards."""
    from vllm.platforms.cpu import CpuPlatform

    if not patching.is_installed(platform.TARGET):
        old = CpuPlatform.__dict__["check_and_update_config"]
        monkeypatch.setitem(patching._installed, platform.TARGET,
                            patching.Installed(old, ()))
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    environ = dict(os.environ)
    yield CpuPlatform
    os.environ.clear()
    os.environ.update(environ)


def config(architecture: str, *, block_size=16, chunked=True, prefix=True, batched=64, mamba_block_size=16,
           user_block=False):
    from vllm.config import CompilationMode

    ns = types.SimpleNamespace
    text = ns(model_type="kimi_k3", layer_types=["linear_attention", "full_attention"])
    return ns(
        model_config=ns(architecture=architecture, use_mla=True, hf_config=text, hf_text_config=text,
                        has_inner_state=True, max_model_len=4096, is_hybrid=True),
        cache_config=ns(block_size=block_size, user_specified_block_size=user_block, enable_prefix_caching=prefix,
                        mamba_cache_mode="align" if prefix else "none", mamba_block_size=mamba_block_size,
                        mamba_ssm_cache_dtype="float32", kv_cache_memory_bytes=None),
        scheduler_config=ns(enable_chunked_prefill=chunked, max_num_batched_tokens=batched, async_scheduling=True,
                            DEFAULT_MAX_NUM_BATCHED_TOKENS=2048),
        attention_config=ns(backend=None),
        parallel_config=ns(distributed_executor_backend="mp", worker_cls="auto", enable_dbo=False,
                           tensor_parallel_size=1),
        compilation_config=ns(mode=CompilationMode.NONE, cudagraph_capture_sizes=[1], custom_ops=[],
                              inductor_compile_config={}),
        lora_config=None, kv_transfer_config=None, profiler_config=ns(torch_profiler_dump_cuda_time_total=True),
        device_config=ns(device_type="cpu"),
    )


def test_vllm_turns_chunked_prefill_and_caching_off_for_other_mla_models(cpu_platform):
    cfg = config("DeepseekV3ForCausalLM", block_size=128, user_block=True)
    platform.check_and_update_config(cpu_platform, cfg)
    assert (cfg.scheduler_config.enable_chunked_prefill, cfg.cache_config.enable_prefix_caching) == (False, False)
    assert cfg.scheduler_config.max_num_batched_tokens == 4096 and cfg.cache_config.block_size == 16


@pytest.mark.parametrize("architecture", platform.KIMI_ARCHITECTURES)
def test_kimi_models_keep_chunked_prefill_caching_and_the_batch_budget(cpu_platform, architecture):
    cfg = config(architecture)
    platform.check_and_update_config(cpu_platform, cfg)
    assert (cfg.scheduler_config.enable_chunked_prefill, cfg.cache_config.enable_prefix_caching) == (True, True)
    assert cfg.scheduler_config.max_num_batched_tokens == 64 and cfg.cache_config.block_size == 16
    assert cfg.scheduler_config.async_scheduling is False  # the rest of vLLM's hook still ran


def test_kimi_without_chunked_prefill_gets_vllms_batch_budget(cpu_platform):
    cfg = config("KimiK3ForConditionalGeneration", chunked=False)
    platform.check_and_update_config(cpu_platform, cfg)
    assert cfg.scheduler_config.enable_chunked_prefill is False and cfg.cache_config.enable_prefix_caching
    assert cfg.scheduler_config.max_num_batched_tokens == 4096


def test_a_rerun_keeps_the_aligned_block_and_the_mamba_block_follows(cpu_platform):
    """S11: the hook runs again after the KV setup chose 128-token blocks; vLLM alone would reset them to 16."""
    cfg = config("KimiK3ForConditionalGeneration", block_size=128, mamba_block_size=16)
    platform.check_and_update_config(cpu_platform, cfg)
    assert cfg.cache_config.block_size == 128 and cfg.cache_config.mamba_block_size == 128


def test_a_block_that_is_no_kernel_multiple_is_still_lowered(cpu_platform):
    cfg = config("KimiK3ForConditionalGeneration", block_size=24, prefix=False, mamba_block_size=None)
    platform.check_and_update_config(cpu_platform, cfg)
    assert cfg.cache_config.block_size == 16 and cfg.cache_config.mamba_block_size is None
