"""The whole latent-MoE layer on two real gloo ranks: off, on, sp and tiered against the float64 single-process
reference, against each other, on every rank alike; what on and sp refuse."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from moe_dedup_helpers import REF_RTOL, assert_near_reference

from opts.moe_dedup.bench.ranks import RankError, RankPool
from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.layer import layer_job, random_tokens
from opts.moe_dedup.reference import reference_layer
from opts.moe_dedup.shape import TEST_SHAPE, MoeShape
from opts.moe_dedup.weights import random_weights

MODES = ("off", "on", "sp")
TIERED = MoeDedupConfig(mode="tiered", tier_threshold=4)


def run_layer(pool: RankPool, shape: MoeShape, configs: list[MoeDedupConfig], num_tokens: int, seed: int
              ) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Each rank's output per config (collectives' buffers NaN first) and the float64 reference."""
    outs = pool.run(layer_job, shape, configs, num_tokens, seed, seed + 1, poison=True)
    reference = reference_layer(random_tokens(shape, num_tokens, seed + 1), random_weights(shape, seed), shape)
    return outs, reference


@pytest.mark.spawns
@pytest.mark.parametrize("num_tokens", [1, 3, 64])
def test_every_mode_matches_the_reference_on_every_rank(pool: RankPool, num_tokens: int) -> None:
    configs = [MoeDedupConfig(mode=m) for m in MODES] + [TIERED]
    outs, reference = run_layer(pool, TEST_SHAPE, configs, num_tokens, seed=10 + num_tokens)
    names = [*MODES, "tiered"]
    for rank, per_mode in enumerate(outs):
        for name, out in zip(names, per_mode, strict=True):
            assert out.shape == (num_tokens, TEST_SHAPE.hidden)
            assert_near_reference(out, reference, f"{name} on rank {rank} at {num_tokens} tokens")
    for i, name in enumerate(names):
        assert torch.equal(outs[0][i], outs[1][i]), f"{name}: the ranks' outputs differ"
    off, on, sp, tiered = outs[0]
    scale = reference.abs().max().item()
    torch.testing.assert_close(on, off, atol=1e-5 * scale, rtol=0)
    torch.testing.assert_close(sp, off, atol=1e-5 * scale, rtol=0)
    assert torch.equal(tiered, off if num_tokens <= TIERED.tier_threshold else on)


@pytest.mark.spawns
def test_routed_scaling_factor_other_than_one(pool: RankPool) -> None:
    shape = dataclasses.replace(TEST_SHAPE, routed_scaling_factor=2.5)
    outs, reference = run_layer(pool, shape, [MoeDedupConfig(mode="off"), MoeDedupConfig(mode="sp")], 16, seed=3)
    for rank, (off, sp) in enumerate(outs):
        assert_near_reference(off, reference, f"off, scaled, rank {rank}")
        assert_near_reference(sp, reference, f"sp, scaled, rank {rank}")
    unscaled = reference_layer(random_tokens(shape, 16, 4), random_weights(shape, 3), TEST_SHAPE)
    assert (reference - unscaled).abs().max() > 100 * REF_RTOL * reference.abs().max()
    for config in (MoeDedupConfig(mode="on"), MoeDedupConfig(mode="tiered", tier_threshold=0)):
        with pytest.raises(RankError, match=r"routed_scaling_factor: invalid value 2.5 for the sharded tail"):
            pool.run(layer_job, shape, [config], 16, 3, 4)


@pytest.mark.spawns
def test_hidden_not_divisible_by_world_size(pool: RankPool) -> None:
    shape = dataclasses.replace(TEST_SHAPE, hidden=255)
    outs, reference = run_layer(pool, shape, [MoeDedupConfig(mode="off"), MoeDedupConfig(mode="sp")], 5, seed=7)
    for rank, (off, sp) in enumerate(outs):
        assert_near_reference(off, reference, f"off at hidden 255, rank {rank}")
        assert_near_reference(sp, reference, f"sp at hidden 255, rank {rank}")
    with pytest.raises(RankError, match=r"(?s)rank 0: .*world_size: invalid value 2; the sharded tail splits "
                                        r"the hidden size \(255\) evenly"):
        pool.run(layer_job, shape, [MoeDedupConfig(mode="on")], 5, 7, 8)


@pytest.mark.spawns
def test_intermediate_or_experts_not_divisible_by_world_size(pool: RankPool) -> None:
    odd_intermediate = dataclasses.replace(TEST_SHAPE, moe_intermediate=63)
    for mode in ("off", "on"):
        with pytest.raises(RankError, match=r"world_size: invalid value 2; it must divide moe_intermediate \(63\)"):
            pool.run(layer_job, odd_intermediate, [MoeDedupConfig(mode=mode)], 4, 0, 1)
    odd_experts = dataclasses.replace(TEST_SHAPE, num_experts=7)
    with pytest.raises(RankError, match=r"world_size: invalid value 2; it must divide num_experts \(7\)"):
        pool.run(layer_job, odd_experts, [MoeDedupConfig(mode="sp")], 4, 0, 1)
    assert pool.run(layer_job, TEST_SHAPE, [MoeDedupConfig(mode="off")], 2, 0, 1)[0][0].shape == (2, 256)
