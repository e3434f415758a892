"""The project's CPU path for vLLM's Kimi K3 / Kimi-Linear serving code (installed by the plugin).

Each replacement is an attribute of an installed vLLM module or class, set from here; nothing in
the installed vllm is edited. `REPLACED_KERNELS` are the counted compute kernels (see counters.py).
See README.md for each failure and its fix.
"""

from __future__ import annotations

from ablations.backends.vllm.counters import counted
from ablations.backends.vllm.cpu import (
    attn_res,
    conv,
    kda,
    kda_metadata,
    kv_blocks,
    loader,
    mamba_align,
    mla,
    mtp,
    platform,
    sampling,
)
from ablations.backends.vllm.cpu.patching import original, replace, wrap_init
from ablations.backends.vllm.cpu.triton_dispatch import rebind_kernels

K3 = "vllm.models.kimi_k3.nvidia"
KDA_OPS = f"{K3}.ops.third_party.kda"
KIMI_LINEAR_KDA = "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"
GATHER_STATES = "vllm.model_executor.layers.mamba.ops.gather_initial_states"

# (target, replacement, counter name): counted compute kernels.
KERNELS = [
    (f"{KDA_OPS}:chunk_kda_with_fused_gate", kda.chunk_kda_with_fused_gate, "kda_chunk_prefill"),
    (f"{KDA_OPS}:fused_recurrent_kda", kda.fused_recurrent_kda, "kda_recurrent_verify"),
    (f"{KDA_OPS}:fused_recurrent_kda_packed_decode", kda.fused_recurrent_kda_packed_decode, "kda_packed_decode"),
    (f"{K3}.kda:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states"),
    (f"{KIMI_LINEAR_KDA}:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states"),
    (f"{GATHER_STATES}:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states"),
    (f"{K3}.kda:causal_conv1d_update", conv.causal_conv1d_update, "conv_update"),
    (f"{KIMI_LINEAR_KDA}:causal_conv1d_update", conv.causal_conv1d_update, "conv_update"),
    (f"{K3}.kda_metadata:_mamba_get_block_table_tensor", kda_metadata.mamba_get_block_table_tensor,
     "kda_aligned_state_slots"),
    (f"{K3}.mla:fused_mla_key_concat_kv_cache_insert", mla.fused_mla_key_concat_kv_cache_insert,
     "mla_prefill_key_concat_cache_insert"),
    (f"{K3}.mla:fused_mla_decode_q_concat_kv_cache_insert", mla.fused_mla_decode_q_concat_kv_cache_insert,
     "mla_decode_q_concat_cache_insert"),
    (f"{K3}.mla:fused_mla_kv_concat", mla.fused_mla_kv_concat, "mla_context_key_concat"),
    (f"{K3}.mla:fused_q_kv_rmsnorm", mla.fused_q_kv_rmsnorm, "mla_q_kv_rmsnorm"),
    (mla.GATHER_TARGET, mla.gather_context_latent, "mla_context_gather"),
    ("vllm.v1.attention.backends.mla.prefill.cpu_sdpa:CPUSDPAMLAPrefillBackend.run_prefill_context_chunk",
     mla.run_prefill_context_chunk, "mla_context_chunk_attention"),
    (f"{K3}.mtp:fused_mtp_input", mtp.fused_mtp_input, "mtp_input"),
    (f"{K3}.model:attn_res", attn_res.attn_res, "attn_res"),
    ("vllm.v1.worker.cpu_model_runner:CPUModelRunner._zero_block_ids", kv_blocks.zero_block_ids,
     "zero_new_blocks"),
]


# Triton kernels replaced through vLLM's own override registry (vllm/triton_utils/dispatcher.py), after
# the platform registered its C++ ones (v1/worker/worker_base.py:282): (kernel, implementation, counter).
TRITON_KERNELS = [
    (mamba_align.PRECOPY, mamba_align.precopy_mamba_align_fused_kernel, "mamba_align_precopy"),
    (mamba_align.POSTPROCESS, mamba_align.postprocess_mamba_fused_kernel, "mamba_align_postprocess"),
    (sampling.GREEDY, sampling.rejection_greedy_sample, "rejection_sample_greedy"),
    (sampling.RANDOM, sampling.rejection_random_sample, "rejection_sample_random"),
]
OVERRIDES_TARGET = "vllm.platforms.cpu:CpuPlatform.register_triton_kernel_overrides"


def register_triton_kernel_overrides(cls) -> None:
    original(OVERRIDES_TARGET).__get__(None, cls)()
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:
        return
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({name: counted(counter)(impl) for name, impl, counter in TRITON_KERNELS})


def no_gemm_allreduce(vllm_config, use_sequence_parallel) -> bool:
    """The cutlass GEMM+all-reduce (VLLM_KIMI_K3_GEMM_AR, on by default) does not exist on CPU."""
    return False


def install() -> None:
    """Install every replacement (idempotent)."""
    replace("vllm.triton_utils.dispatcher:_rebind_kernels", rebind_kernels)
    replace(platform.TARGET, classmethod(platform.check_and_update_config))
    replace(
        "vllm.v1.attention.backends.mla.cpu_mla:CPUMLABackend.supports_block_size",
        classmethod(kv_blocks.supports_block_size),
    )
    replace(OVERRIDES_TARGET, classmethod(register_triton_kernel_overrides))
    replace(f"{K3}.model:maybe_init_gemm_rs_ar", no_gemm_allreduce)
    wrap_init(f"{K3}.mla:MultiHeadLatentAttention", mla.prepare_layer)
    replace(kda.K3_FORWARD, kda.observe_mixed_steps)
    wrap_init(f"{K3}.model:KimiDecoderLayer", attn_res.keep_res_proj_weights)
    wrap_init(f"{K3}.model:KimiLinearModel", attn_res.keep_res_proj_weights)
    for target, new, counter in KERNELS:
        replace(target, new, counter)
    loader.register()


REPLACED_KERNELS = sorted({counter for *_, counter in KERNELS + TRITON_KERNELS})

__all__ = ["REPLACED_KERNELS", "install"]
