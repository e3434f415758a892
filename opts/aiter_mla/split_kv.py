"""Split-KV latent attention over the paged cache, the algorithm of off (`naive.decode`): read the pages where
they lie, one pass, tile by tile.

Each request's context is cut into tiles of whole blocks. A wave of tiles (from any requests) is fetched
from its pages into a staging buffer small enough to stay in cache, both matmuls and the softmax pieces
run on it there, and each tile leaves only its partial output, running max and sum. The tiles of a
request are merged exactly by log-sum-exp at the end. See README.md for the math.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOG2_E = math.log2(math.e)


@dataclass(frozen=True)
class Tiling:
    """How the context is split: `tile_tokens` per work item (whole blocks), `stage_bytes` of latent per wave."""

    tile_tokens: int
    stage_bytes: int

    def __post_init__(self) -> None:
        for name in ("tile_tokens", "stage_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Tiling.{name}: invalid value {value!r}; must be a positive int")


def default_tiling(device_type: str) -> Tiling:
    """Per-device defaults. CPU (measured): 4096-token tiles, one per wave, stay in L2/L3 between the two
    matmuls. GPU (unmeasured): a plain-PyTorch wave costs ~8 kernel launches, and no staging buffer stays on
    chip, so tiles are whole contexts up to 128k tokens and waves batch several requests (512 MB staged)."""
    if device_type == "cpu":
        return Tiling(tile_tokens=4096, stage_bytes=8 << 20)
    return Tiling(tile_tokens=128 << 10, stage_bytes=512 << 20)


MAX_PADDING = 1 / 8


@dataclass(frozen=True)
class SplitPlan:
    """The work items of one decode call: which request, which blocks, how many valid tokens, in which wave."""

    tile_tokens: int
    blocks_per_tile: int
    item_request: torch.Tensor   # [W] long, request of each tile, request-major
    item_blocks: torch.Tensor    # [W * blocks_per_tile], pool block of each tile slot
    item_valid: list[int]        # [W] tokens of each tile inside its context
    waves: list[tuple[int, int]]  # item ranges [start, end) processed together
    max_tiles: int               # most tiles of one request

    @property
    def num_items(self) -> int:
        return len(self.item_valid)

    @property
    def padded_tokens(self) -> int:
        """Tokens the matmuls run over: the contexts plus the padding of each request's last tile."""
        return self.num_items * self.tile_tokens


def tile_blocks(context_lens: list[int], block_size: int, tile_tokens: int) -> int:
    """Blocks per tile: the largest tile (at most `tile_tokens`, at most the longest context) whose padding
    of last tiles stays under MAX_PADDING of the contexts, halving down to one block."""
    blocks = [(n + block_size - 1) // block_size for n in context_lens]
    per_tile = min(max(1, tile_tokens // block_size), max(blocks))
    total = sum(blocks)
    while per_tile > 1 and sum(-(-n // per_tile) * per_tile for n in blocks) > total * (1 + MAX_PADDING):
        per_tile //= 2
    return per_tile


def plan(block_table: torch.Tensor, context_lens: list[int], block_size: int, tiling: Tiling,
         token_bytes: int) -> SplitPlan:
    """Cut every context into tiles of whole blocks and group the tiles into waves of <= `tiling.stage_bytes`.

    `token_bytes` is the size of one cached token (576 x element size). A tile's slots past its request's
    last block point at that last block again (they are masked), so every slot reads a block the request owns.
    """
    per_tile = tile_blocks(context_lens, block_size, tiling.tile_tokens)
    tile = per_tile * block_size
    item_request, valid = [], []
    for b, n in enumerate(context_lens):
        tiles = -(-n // tile)
        item_request += [b] * tiles
        valid += [tile] * (tiles - 1) + [n - (tiles - 1) * tile]
    blocks = [-(-n // block_size) for n in context_lens]
    if len(set(blocks)) == 1 and blocks[0] % per_tile == 0:  # equal contexts, no padding slot: a view
        item_blocks = block_table[:, :blocks[0]].reshape(-1)
    else:
        width, slots = block_table.shape[1], []
        for b, (n, used) in enumerate(zip(context_lens, blocks, strict=True)):
            slots += range(b * width, b * width + used)
            slots += [b * width + used - 1] * (-(-n // tile) * per_tile - used)
        item_blocks = block_table.reshape(-1).index_select(0, torch.tensor(slots, device=block_table.device))
    per_wave = max(1, tiling.stage_bytes // (tile * token_bytes))
    waves = [(w, min(len(valid), w + per_wave)) for w in range(0, len(valid), per_wave)]
    max_tiles = max(-(-n // tile) for n in context_lens)
    device = block_table.device
    requests = (torch.arange(len(context_lens), device=device) if max_tiles == 1
                else torch.tensor(item_request, device=device))
    return SplitPlan(tile, per_tile, requests, item_blocks, valid, waves, max_tiles)


def latent_attention(q_latent: torch.Tensor, kv_cache: torch.Tensor, split: SplitPlan, scale: float,
                     kv_lora_rank: int) -> torch.Tensor:
    """q_latent [B, H, 576] over the planned tiles -> o_latent [B, H, kv_lora] (cache dtype, float32 if merged).

    Scores are kept in base 2 (scale * log2(e) applied as the first matmul's alpha) and the softmax pieces
    run in the cache dtype: the max is exact and exp2 rounds once, as the probabilities fed to the second
    matmul are rounded anyway. Batched waves run the second matmul over all 576 staged columns (a contiguous
    operand is faster than the 512-wide strided view on CPU; the rope columns are dropped after).
    """
    num_blocks, block_size, latent_dim = kv_cache.shape
    tile, per_tile = split.tile_tokens, split.blocks_per_tile
    per_wave = max(end - start for start, end in split.waves)
    pages = kv_cache.view(num_blocks, block_size * latent_dim)
    # Allocated per call on purpose: the allocator hands back recently freed, cache-hot memory, where a
    # buffer kept between calls has gone cold (measured ~8% slower at 4k tokens on CPU).
    stage = torch.empty(per_wave * per_tile, block_size * latent_dim, dtype=kv_cache.dtype,
                        device=kv_cache.device)
    q_items = q_latent if split.max_tiles == 1 else q_latent.index_select(0, split.item_request)
    zero, log2_scale = q_latent.new_zeros(()), scale * LOG2_E
    o_parts, m_parts, l_parts = [], [], []
    for start, end in split.waves:
        n = end - start
        kt = torch.index_select(pages, 0, split.item_blocks[start * per_tile:end * per_tile],
                                out=stage[:n * per_tile]).view(n, tile, latent_dim)
        partial = [(i, v) for i, v in enumerate(split.item_valid[start:end]) if v < tile]
        for i, v in partial:
            kt[i, v:].zero_()
        if n == 1:
            s = torch.addmm(zero, q_items[start], kt[0].T, beta=0, alpha=log2_scale).unsqueeze(0)
        else:
            s = torch.baddbmm(zero, q_items[start:end], kt.transpose(1, 2), beta=0, alpha=log2_scale)
        for i, v in partial:
            s[i, :, v:] = float("-inf")
        m = s.amax(dim=-1, keepdim=True)
        s.sub_(m).exp2_()
        l_parts.append(s.sum(dim=-1, keepdim=True))
        m_parts.append(m)
        if n == 1:
            o_parts.append(torch.mm(s[0], kt[0, :, :kv_lora_rank]).unsqueeze(0))
        else:
            o_parts.append(torch.bmm(s, kt)[:, :, :kv_lora_rank])
    o, l = (o_parts[0], l_parts[0]) if len(o_parts) == 1 else (torch.cat(o_parts), torch.cat(l_parts))
    if split.max_tiles == 1:
        return o / l
    m = m_parts[0] if len(m_parts) == 1 else torch.cat(m_parts)
    return merge(o, m, l, split.item_request, q_latent.shape[0])


def merge(o: torch.Tensor, m: torch.Tensor, l: torch.Tensor, item_request: torch.Tensor,
          batch: int) -> torch.Tensor:
    """Exact log-sum-exp merge of per-tile partials into [B, H, kv_lora] (float32 or wider), in base 2.

    Per tile t: m_t [W, H, 1] its max score, l_t = sum_j 2^(s_j - m_t), o_t [W, H, kv_lora] =
    sum_j 2^(s_j - m_t) c_j. With M the request's max of m_t: o = sum_t 2^(m_t - M) o_t / sum_t 2^(m_t - M) l_t.
    """
    items, heads, rank = o.shape
    acc = torch.promote_types(o.dtype, torch.float32)
    m = m.to(acc)
    index = item_request[:, None, None].expand(items, heads, 1)
    m_req = torch.full((batch, heads, 1), float("-inf"), dtype=acc, device=o.device)
    m_req.scatter_reduce_(0, index, m, "amax")
    weight = m.sub_(m_req.index_select(0, item_request)).exp2_()
    num = torch.zeros(batch, heads, rank, dtype=acc, device=o.device)
    num.index_add_(0, item_request, torch.mul(o, weight))
    den = torch.zeros(batch, heads, 1, dtype=acc, device=o.device).index_add_(0, item_request, torch.mul(l, weight))
    return num.div_(den)

