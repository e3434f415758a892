"""split_kv's planning and merge: tiles cover exactly the contexts, read only owned blocks, merge exactly."""

from __future__ import annotations

import pytest
import torch

from opts.aiter_mla import make_inputs, split_kv
from opts.k3.mla import K3_TP8, absorb_query


def test_plan_tiles_cover_each_context_once_and_read_only_owned_blocks() -> None:
    lens, block_size = [1, 17, 300, 1000, 64], 16
    inputs = make_inputs(lens, block_size=block_size, dtype=torch.float32, spare_blocks=5)
    plan = split_kv.plan(inputs.block_table, lens, block_size, split_kv.Tiling(128, 1 << 20), 576 * 4)
    requests = plan.item_request.tolist()
    blocks = plan.item_blocks.view(plan.num_items, plan.blocks_per_tile)
    assert plan.tile_tokens == plan.blocks_per_tile * block_size
    for b, n in enumerate(lens):
        items = [i for i, r in enumerate(requests) if r == b]
        assert items == list(range(items[0], items[0] + len(items))), "a request's tiles are consecutive"
        assert sum(plan.item_valid[i] for i in items) == n
        assert all(plan.item_valid[i] == plan.tile_tokens for i in items[:-1])
        owned = inputs.block_table[b, : -(-n // block_size)].tolist()
        read = blocks[items].reshape(-1).tolist()
        assert read[: len(owned)] == owned, "tiles read the request's blocks in order"
        assert set(read) <= set(owned), "padding slots point at the request's own blocks"
    covered = [i for start, end in plan.waves for i in range(start, end)]
    assert covered == list(range(plan.num_items))


@pytest.mark.parametrize(("lens", "block_size", "tile_tokens", "expected_blocks"), [
    ([4096] * 16, 64, 4096, 64),        # uniform: the whole context in one tile
    ([32768], 64, 4096, 64),            # long: capped at tile_tokens
    ([100], 16, 4096, 7),               # short: no longer than the context
    ([4096] + [100] * 15, 64, 4096, 2),  # mixed: halved until padding <= 1/8
    ([5], 1, 8, 5),                     # block size 1
    ([10], 64, 16, 1),                  # tile smaller than a block: one block
])
def test_tile_choice(lens: list[int], block_size: int, tile_tokens: int, expected_blocks: int) -> None:
    per_tile = split_kv.tile_blocks(lens, block_size, tile_tokens)
    assert per_tile == expected_blocks
    blocks = [-(-n // block_size) for n in lens]
    padded = sum(-(-n // per_tile) * per_tile for n in blocks)
    assert per_tile == 1 or padded <= sum(blocks) * (1 + split_kv.MAX_PADDING)


def test_waves_respect_the_stage_budget() -> None:
    lens = [3000, 2000]
    inputs = make_inputs(lens, block_size=64, dtype=torch.bfloat16)
    token_bytes = 576 * 2
    stage = 600_000
    plan = split_kv.plan(inputs.block_table, lens, 64, split_kv.Tiling(128, stage), token_bytes)
    assert all((end - start) * plan.tile_tokens * token_bytes <= stage for start, end in plan.waves)
    assert max(end - start for start, end in plan.waves) > 1


def test_merge_is_exact() -> None:
    # Many small tiles merged by log-sum-exp give the same result as one tile over the whole context.
    inputs = make_inputs([2048, 1500], block_size=16, dtype=torch.float64, seed=11)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    lens = inputs.context_lens.tolist()
    results = []
    for tiling in (split_kv.Tiling(2048, 1 << 30), split_kv.Tiling(16, 1), split_kv.Tiling(64, 1 << 20)):
        plan = split_kv.plan(inputs.block_table, lens, 16, tiling, 576 * 8)
        results.append(split_kv.latent_attention(q, inputs.kv_cache, plan, K3_TP8.softmax_scale, 512))
    assert split_kv.plan(inputs.block_table, lens, 16, split_kv.Tiling(16, 1), 576 * 8).max_tiles == 128
    torch.testing.assert_close(results[1].double(), results[0].double(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(results[2].double(), results[0].double(), rtol=1e-12, atol=1e-12)


def test_merge_survives_scores_far_apart() -> None:
    # One tile holds a key whose score dwarfs the rest: the merge must not overflow or lose it.
    inputs = make_inputs([256], block_size=16, dtype=torch.float32, shuffle=False, seed=2)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    cache = inputs.kv_cache.clone()
    cache[10, 3] = q[0, 0] * 50  # token 163: head 0 scores it ~600, e^600 overflows float32
    plan = split_kv.plan(inputs.block_table, [256], 16, split_kv.Tiling(16, 1), 576 * 4)
    o = split_kv.latent_attention(q, cache, plan, K3_TP8.softmax_scale, 512)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o[0, 0], cache[10, 3, :512].float())


def test_tiling_is_validated() -> None:
    with pytest.raises(ValueError, match=r"Tiling\.tile_tokens: invalid value 0"):
        split_kv.Tiling(0, 1)
    with pytest.raises(ValueError, match=r"Tiling\.stage_bytes: invalid value -5"):
        split_kv.Tiling(64, -5)
