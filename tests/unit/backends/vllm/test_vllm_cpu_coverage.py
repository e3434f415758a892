"""Every counted replacement has a test that compares it with vLLM, in the file named here."""

from __future__ import annotations

from pathlib import Path

from ablations.backends.vllm.in_vllm import cpu

COMPARED_IN = {
    "attn_res": "test_vllm_cpu_small_kernels.py",
    "conv_update": "test_vllm_cpu_conv.py",
    "kda_aligned_state_slots": "test_vllm_cpu_small_kernels.py",
    "kda_chunk_prefill": "test_vllm_cpu_kda.py",
    "kda_gather_initial_states": "test_vllm_cpu_kda.py",
    "kda_packed_decode": "test_vllm_cpu_kda.py",
    "kda_recurrent_verify": "test_vllm_cpu_kda.py",
    "mamba_align_postprocess": "test_vllm_cpu_align.py",
    "mamba_align_precopy": "test_vllm_cpu_align.py",
    "mla_context_chunk_attention": "test_vllm_cpu_mla.py",
    "mla_context_gather": "test_vllm_cpu_mla.py",
    "mla_context_key_concat": "test_vllm_cpu_mla.py",
    "mla_decode_q_concat_cache_insert": "test_vllm_cpu_mla.py",
    "mla_prefill_key_concat_cache_insert": "test_vllm_cpu_mla.py",
    "mla_q_kv_rmsnorm": "test_vllm_cpu_mla.py",
    "mtp_input": "test_vllm_cpu_small_kernels.py",
    "rejection_sample_greedy": "test_vllm_cpu_sampling.py",
    "rejection_sample_random": "test_vllm_cpu_sampling.py",
    "zero_new_blocks": "test_vllm_cpu_kv_blocks.py",
}


def test_every_replaced_kernel_is_called_in_its_test_file():
    assert sorted(COMPARED_IN) == cpu.REPLACED_KERNELS
    pairs = [(new, counter) for _, new, counter, _ in cpu.KERNELS] + [(new, c) for _, new, c in cpu.TRITON_KERNELS]
    for replacement, counter in pairs:
        text = (Path(__file__).parent / COMPARED_IN[counter]).read_text()
        assert f"{replacement.__name__}(" in text, f"{counter}: {replacement.__name__} not called there"
