"""KDA metadata helper of vLLM's K3 builder (vllm/models/kimi_k3/nvidia/kda_metadata.py:101-137) that
asserts CUDA tensors and launches Triton: the state slots of each request in prefix-caching
"align" mode (the block holding token seq_len-1, then the speculative blocks after it)."""

from __future__ import annotations

import torch


def mamba_get_block_table_tensor(block_table, seq_lens, kv_cache_spec, mamba_cache_mode):
    if mamba_cache_mode == "none":
        return block_table
    num_slots = 1 + kv_cache_spec.num_speculative_blocks
    first = ((seq_lens.long() - 1) // kv_cache_spec.block_size).clamp_(min=0)
    columns = first.view(-1, 1) + torch.arange(num_slots, device=block_table.device)
    inside = columns < block_table.shape[1]
    slots = torch.gather(block_table[: seq_lens.shape[0]], 1, columns.clamp(max=block_table.shape[1] - 1))
    return torch.where(inside, slots, torch.zeros_like(slots))  # 0: the null block
