"""KV-cache block handling for hybrid KDA + MLA models on vLLM-CPU.

- S6: the hybrid alignment raises the manager block to >= 128 tokens for MLA
  (platforms/interface.py:1082) and splits it into 16-token kernel blocks, but
  `CPUMLABackend.supports_block_size` (cpu_mla.py:72) only accepts exactly 16, so the engine
  refuses to start (interface.py:820). Any multiple of its 16-token kernel block works.
- S10: `CPUModelRunner._zero_block_ids` (v1/worker/cpu_model_runner.py:114-133) zeroes
  `kv[manager_block_id]` on MLA caches indexed by 16-token kernel blocks: it wipes the wrong
  memory, another block of the shared pool, which can hold a live request's KDA state. Here every
  kernel block of each new manager block is zeroed.
"""

from __future__ import annotations

import torch

MLA_KERNEL_BLOCK = 16


def supports_block_size(cls, block_size: int | None) -> bool:
    return block_size is None or (block_size > 0 and block_size % MLA_KERNEL_BLOCK == 0)


def kernel_block_ids(block_ids: list[int], kernel_blocks_per_block: int) -> torch.Tensor:
    """Kernel block ids covering manager blocks `block_ids`."""
    ids = torch.tensor(block_ids, dtype=torch.long).view(-1, 1)
    return (ids * kernel_blocks_per_block + torch.arange(kernel_blocks_per_block)).flatten()


def zero_block_ids(self, block_ids: list[int]) -> None:
    """Zero every full-attention cache page of the manager blocks `block_ids`."""
    if not block_ids:
        return
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    num_blocks = self.kv_cache_config.num_blocks
    seen: set[int] = set()
    for group in self.kv_cache_config.kv_cache_groups:
        if not isinstance(group.kv_cache_spec, FullAttentionSpec):
            continue
        for layer_name in group.layer_names:
            layer = self.compilation_config.static_forward_context.get(layer_name)
            kv = getattr(layer, "kv_cache", None)
            if not isinstance(kv, torch.Tensor) or kv.data_ptr() in seen or kv.numel() == 0:
                continue
            seen.add(kv.data_ptr())
            per_block, rest = divmod(kv.shape[0], num_blocks)
            if rest:
                raise RuntimeError(
                    f"{layer_name}: {kv.shape[0]} cache blocks is not a multiple of {num_blocks} manager blocks"
                )
            kv.index_fill_(0, kernel_block_ids(block_ids, per_block), 0)
