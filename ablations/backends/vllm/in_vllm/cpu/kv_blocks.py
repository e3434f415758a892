"""KV-cache block handling for hybrid KDA + MLA models on vLLM-CPU.

- S6: the hybrid alignment raises the manager block to >= 128 tokens for MLA
  (platforms/interface.py:1082) and splits it into 16-token kernel blocks, but
  `CPUMLABackend.supports_block_size` (cpu_mla.py:72) only accepts exactly 16, so the engine
  refuses to start (interface.py:820). Any multiple of its 16-token kernel block works.
- S10: `CPUModelRunner._zero_block_ids` (v1/worker/cpu_model_runner.py:114-133) zeroes
  `kv[manager_block_id]` on MLA caches indexed by 16-token kernel blocks: it wipes the wrong
  memory, another block of the shared pool, which can hold a live request's KDA state. Here every
  kernel block of each new manager block is zeroed.
- S22: with a fine prefix-match unit (`prefix_match_unit` below the 128-token block), a hit that ends inside
  a block copies the shared MLA block into the request's private one (copy-on-write,
  v1/core/single_type_kv_cache_manager.py:387-397); the runner does it with
  `copy_kv_cache_blocks_inplace` (v1/worker/utils.py:909-952, called at gpu_model_runner.py:1203-1208),
  which copies each distinct `data_ptr` once (:919-925). The hybrid cache overlays a KDA layer and an MLA
  layer on the same bytes (`allocate_kv_cache`, utils.py:564), and the KDA layer comes first: its view
  covers only the 74752-byte state at the start of each 294912-byte page, so the MLA view at the same
  address is skipped and the copy keeps only about the first 32 of the block's 128 tokens; the rest of the
  request's block stays zero. Here every address is copied once over the widest extent of the views
  that start there, in one indexed copy (all sources read before any destination is written, as stock).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def block_extent_bytes(cache: torch.Tensor, kernel_blocks_per_block: int) -> int:
    """Bytes from the start of one manager block of `cache` to the end of its last element."""
    elem = cache.element_size()
    last = sum((size - 1) * stride for size, stride in zip(cache.shape[1:], cache.stride()[1:], strict=True))
    return elem * ((kernel_blocks_per_block - 1) * cache.stride(0) + last + 1)


def copy_kv_cache_blocks_inplace(
    kv_caches: Iterable[torch.Tensor], num_blocks: int, kv_cache_block_copies: Sequence[tuple[int, int]],
) -> None:
    """Copy manager block `src` to `dst` for each (src, dst) pair, in every cache of `kv_caches`: views that
    start at the same address are copied once, over the widest of them."""
    if not kv_cache_block_copies:
        return
    regions: dict[tuple[torch.device, int, int], tuple[torch.Tensor, int]] = {}
    for cache in kv_caches:
        if cache.numel() == 0:
            continue
        kernel_blocks_per_block, rest = divmod(cache.shape[0], num_blocks)
        if rest:
            raise RuntimeError(f"{cache.shape[0]} kernel blocks is not a multiple of {num_blocks} manager blocks")
        block_stride = cache.stride(0) * cache.element_size() * kernel_blocks_per_block
        extent = block_extent_bytes(cache, kernel_blocks_per_block)
        if extent > block_stride:
            raise RuntimeError(f"a cache view's block ({extent} bytes) overruns its block stride ({block_stride})")
        key = (cache.device, cache.data_ptr(), block_stride)
        widest = regions.get(key)
        if widest is None or extent > widest[1]:
            regions[key] = (cache, extent)
    pairs = torch.tensor([[int(src), int(dst)] for src, dst in kv_cache_block_copies], dtype=torch.long)
    for (device, _, block_stride), (cache, extent) in regions.items():
        src, dst = pairs.to(device).unbind(1)
        blocks = torch.empty(0, dtype=torch.uint8, device=device)
        blocks.set_(cache.untyped_storage(), cache.storage_offset() * cache.element_size(),
                    (num_blocks, extent), (block_stride, 1))
        blocks[dst] = blocks[src]
