"""Random decode inputs over a paged latent cache, for the tests and the benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from opts.k3.mla import K3_TP8, MLAShape

RANDOM_CHUNK = 1 << 25


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step: a query token per request and the paged cache it attends to."""

    q_nope: torch.Tensor       # [B, H, qk_nope]
    q_pe: torch.Tensor         # [B, H, rope]
    kv_cache: torch.Tensor     # [num_blocks, block_size, kv_lora + rope]
    block_table: torch.Tensor  # [B, max_blocks] int32, -1 past each request's last block
    context_lens: torch.Tensor  # [B] int32
    w_uk: torch.Tensor         # [H, qk_nope, kv_lora]
    w_uv: torch.Tensor         # [H, v_head, kv_lora]
    shape: MLAShape = K3_TP8

    def args(self) -> tuple[torch.Tensor, ...]:
        """The positional arguments of every `decode` function."""
        return (self.q_nope, self.q_pe, self.kv_cache, self.block_table, self.context_lens, self.w_uk, self.w_uv)

    def empty_out(self, fill: float = float("nan")) -> torch.Tensor:
        """An output buffer [B, H, v_head] filled with `fill` (NaN by default, so unwritten elements show)."""
        b = self.q_nope.shape[0]
        return torch.full((b, self.shape.num_heads, self.shape.v_head_dim), fill, dtype=self.kv_cache.dtype,
                          device=self.kv_cache.device)


def make_inputs(context_lens: list[int], *, shape: MLAShape = K3_TP8, block_size: int = 64,
                dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu", seed: int = 0,
                shuffle: bool = True, spare_blocks: int = 0, poison_unused: bool = False) -> DecodeInputs:
    """Random inputs, N(0, 1) latents and queries, weights scaled so each head's keys and values are O(1).

    `shuffle` scatters the blocks over the pool in random order (non-contiguous block tables);
    `spare_blocks` adds pool blocks no request uses; `poison_unused` fills every cache slot outside the
    contexts (the tail of each last block, the spare blocks) with NaN, so reading one shows in the result.
    A cache larger than RANDOM_CHUNK elements repeats one random chunk (benchmark sizes: the values do
    not change the timing, and drawing gigabytes of normals would take longer than the benchmark).
    """
    if not context_lens or min(context_lens) < 1:
        raise ValueError(f"context_lens: invalid value {context_lens!r}; need at least one length, each >= 1")
    if block_size < 1:
        raise ValueError(f"block_size: invalid value {block_size}; must be >= 1")
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_req = [(n + block_size - 1) // block_size for n in context_lens]
    num_blocks = sum(blocks_per_req) + spare_blocks
    order = (torch.randperm(num_blocks, generator=gen, device=device) if shuffle
             else torch.arange(num_blocks, device=device))
    table = torch.full((len(context_lens), max(blocks_per_req)), -1, dtype=torch.int32, device=device)
    start = 0
    for b, n in enumerate(blocks_per_req):
        table[b, :n] = order[start:start + n]
        start += n

    def randn(*size: int, std: float = 1.0) -> torch.Tensor:
        x = torch.randn(*size, generator=gen, device=device, dtype=dtype)
        return x.mul_(std) if std != 1.0 else x

    batch, h = len(context_lens), shape.num_heads
    kv_cache = torch.empty(num_blocks, block_size, shape.latent_dim, dtype=dtype, device=device)
    flat = kv_cache.view(-1)
    chunk = randn(min(flat.numel(), RANDOM_CHUNK))
    for start in range(0, flat.numel(), chunk.numel()):
        piece = flat[start:start + chunk.numel()]
        piece.copy_(chunk[:piece.numel()])
    if poison_unused:
        used = torch.zeros(num_blocks, block_size, dtype=torch.bool, device=device)
        for b, n in enumerate(context_lens):
            tokens = torch.arange(n, device=device)
            used[table[b, tokens // block_size].long(), tokens % block_size] = True
        kv_cache[~used] = float("nan")
    w_std = shape.kv_lora_rank ** -0.5
    return DecodeInputs(
        q_nope=randn(batch, h, shape.qk_nope_dim),
        q_pe=randn(batch, h, shape.rope_dim),
        kv_cache=kv_cache,
        block_table=table,
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        w_uk=randn(h, shape.qk_nope_dim, shape.kv_lora_rank, std=w_std),
        w_uv=randn(h, shape.v_head_dim, shape.kv_lora_rank, std=w_std),
        shape=shape,
    )
