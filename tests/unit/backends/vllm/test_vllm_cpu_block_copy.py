"""Copy-on-write block copies (cpu/kv_blocks.py, S22) against vLLM's `copy_kv_cache_blocks_inplace`
(v1/worker/utils.py:909-952), which copies each cache address once, through the first view found there."""

from __future__ import annotations

import torch

from ablations.backends.vllm.in_vllm.cpu import kv_blocks

NUM_BLOCKS = 6
KERNEL_BLOCKS = 4  # 16-token kernel blocks per manager block
TOKENS, WIDTH = 16, 8  # MLA kernel block: 16 tokens x 8 floats
PAGE = KERNEL_BLOCKS * TOKENS * WIDTH * 4  # bytes per manager block
STATE = 300  # bytes of a KDA state, at the start of its page


def overlay(num_tensors: int = 2) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """vLLM's hybrid layout (`allocate_kv_cache`): one backing buffer; per KV-cache tensor a KDA layer's state view
    (first `STATE` bytes of each page) and an MLA layer's kernel-block view over the same bytes, KDA first."""
    buf = torch.randint(-128, 128, (num_tensors * NUM_BLOCKS * PAGE,), dtype=torch.int8)
    caches = []
    for t in range(num_tensors):
        base = t * NUM_BLOCKS * PAGE
        caches.append(buf[base:].as_strided((NUM_BLOCKS, 1, 1, STATE), (PAGE, STATE, STATE, 1)))
        mla = buf[base:base + NUM_BLOCKS * PAGE].view(torch.float32)
        caches.append(mla.view(NUM_BLOCKS * KERNEL_BLOCKS, 1, TOKENS, WIDTH))
    return buf, caches


def pages(buf: torch.Tensor) -> torch.Tensor:
    return buf.view(-1, NUM_BLOCKS, PAGE)


def test_block_extent_covers_every_kernel_block_of_a_manager_block():
    _, (state, mla) = overlay(1)
    assert kv_blocks.block_extent_bytes(state, 1) == STATE
    assert kv_blocks.block_extent_bytes(mla, KERNEL_BLOCKS) == PAGE


def test_copy_on_write_copies_the_whole_mla_page_under_a_kda_view(vllm):
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

    copies = [KVCacheBlockCopy(4, 1), KVCacheBlockCopy(2, 5)]
    ours, caches = overlay()
    theirs, stock_caches = overlay()
    theirs.copy_(ours)
    before = pages(ours).clone()
    kv_blocks.copy_kv_cache_blocks_inplace(caches, NUM_BLOCKS, copies)
    copy_kv_cache_blocks_inplace(stock_caches, NUM_BLOCKS, copies)
    expected = before.clone()
    expected[:, [1, 5]] = before[:, [4, 2]]
    assert torch.equal(pages(ours), expected)
    # vLLM's copy stops at the KDA state: the MLA tokens past it keep the destination's old bytes.
    assert torch.equal(pages(theirs)[:, :, :STATE], expected[:, :, :STATE])
    assert not torch.equal(pages(theirs)[:, [1, 5], STATE:], expected[:, [1, 5], STATE:])


def test_equals_vllm_where_each_address_has_one_view(vllm):
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
    from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

    copies = [KVCacheBlockCopy(0, 3), KVCacheBlockCopy(3, 4), KVCacheBlockCopy(5, 0)]  # a chain: reads come first
    ours, caches = overlay()
    theirs, stock_caches = overlay()
    theirs.copy_(ours)
    mla_only = caches[1::2]
    kv_blocks.copy_kv_cache_blocks_inplace(mla_only, NUM_BLOCKS, copies)
    copy_kv_cache_blocks_inplace(stock_caches[1::2], NUM_BLOCKS, copies)
    assert torch.equal(ours, theirs)
    kv_blocks.copy_kv_cache_blocks_inplace(mla_only, NUM_BLOCKS, [])  # nothing to copy
    assert torch.equal(ours, theirs)
