"""The tail alone (from the expert and shared partials to the output) on two real gloo ranks: off, on and sp
against the float64 tail of the summed partials; the collectives each runs; what on refuses, before any
collective; one rank is on == off."""

from __future__ import annotations

import pytest
import torch
from moe_dedup_helpers import assert_near_reference

from opts.moe_dedup.bench.rank_case import tail_job, tail_partials
from opts.moe_dedup.counts import mode_counts
from opts.moe_dedup.layer import latent_norm
from opts.moe_dedup.naive import tail_off
from opts.moe_dedup.reference import reference_tail
from opts.moe_dedup.shape import TEST_SHAPE
from opts.moe_dedup.sharded import hidden_shard, tail_on

MODES = ("off", "on", "sp")
COLLECTIVES = {"off": [("latent_all_reduce", "all_reduce"), ("shared_all_reduce", "all_reduce")],
               "on": [("latent_all_reduce", "all_reduce"), ("final_all_reduce", "all_reduce")],
               "sp": [("combine_reduce_scatter", "reduce_scatter"), ("output_all_gather", "all_gather")]}


@pytest.mark.spawns
@pytest.mark.parametrize("num_tokens", [1, 5, 32])
def test_tails_match_the_reference_and_count_their_collectives(pool, num_tokens: int) -> None:
    found = pool.run(tail_job, TEST_SHAPE, num_tokens, 20 + num_tokens, MODES, poison=True)
    up, norm_weight, fused, shared = tail_partials(TEST_SHAPE, num_tokens, 2, 20 + num_tokens)
    reference = reference_tail(fused, shared, norm_weight, up, TEST_SHAPE)
    for rank, per_mode in enumerate(found):
        for mode, (out, log) in per_mode.items():
            assert_near_reference(out, reference, f"{mode} tail on rank {rank} at {num_tokens} tokens")
            counts = mode_counts(mode, tp=2, num_tokens=num_tokens, shape=TEST_SHAPE, scope="tail", elem_bytes=4)
            assert log == [(op, counts.parts[part].payload_bytes) for part, op in COLLECTIVES[mode]], mode
    for mode in MODES:
        assert torch.equal(found[0][mode][0], found[1][mode][0]), f"{mode}: the ranks' outputs differ"


def _partials(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h, lat = TEST_SHAPE.hidden, TEST_SHAPE.latent
    return (torch.randn(num_tokens, lat, generator=gen), torch.randn(num_tokens, h, generator=gen),
            torch.randn(h, lat, generator=gen) / lat ** 0.5, 1 + 0.1 * torch.randn(lat, generator=gen))


def test_one_rank_on_equals_off() -> None:
    fused, shared, up, norm_weight = _partials(9, 0)
    norm = latent_norm(norm_weight, 1e-6)
    off = tail_off(fused.clone(), shared.clone(), norm=norm, up_weight=up, all_reduce=lambda x: x)
    on = tail_on(fused.clone(), shared.clone(), norm=norm, up_weight=up, all_reduce=lambda x: x, rank=0, world_size=1)
    reference = reference_tail([fused], [shared], norm_weight, up, TEST_SHAPE)
    assert_near_reference(off, reference, "off, one rank")
    torch.testing.assert_close(on, off, atol=1e-6, rtol=1e-6)


def test_on_refuses_before_any_collective() -> None:
    fused, shared, up, norm_weight = _partials(4, 1)
    calls: list[torch.Tensor] = []

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return x

    kwargs = {"norm": latent_norm(norm_weight, 1e-6), "up_weight": up, "all_reduce": all_reduce}
    with pytest.raises(ValueError, match=r"routed_scaling_factor: invalid value 0.5 for the sharded tail \(on\); "
                                         r"valid: 1.0"):
        tail_on(fused, shared, rank=0, world_size=2, routed_scaling_factor=0.5, **kwargs)
    with pytest.raises(ValueError, match=r"world_size: invalid value 3; .*valid: an integer >= 1 dividing 256"):
        tail_on(fused, shared, rank=0, world_size=3, **kwargs)
    with pytest.raises(ValueError, match=r"rank: invalid value 2; valid: 0..1"):
        tail_on(fused, shared, rank=2, world_size=2, **kwargs)
    with pytest.raises(ValueError, match=r"shared_output: last dim 255; valid: the up-projection's hidden size 256"):
        tail_on(fused, shared[:, :255], rank=0, world_size=2, **kwargs)
    assert calls == []
    assert hidden_shard(7168, 3, 8) == (2688, 896)


def test_off_scales_the_routed_part() -> None:
    fused, shared, up, norm_weight = _partials(3, 2)
    norm = latent_norm(norm_weight, 1e-6)
    base = tail_off(fused.clone(), torch.zeros_like(shared), norm=norm, up_weight=up, all_reduce=lambda x: x)
    scaled = tail_off(fused.clone(), shared.clone(), norm=norm, up_weight=up, all_reduce=lambda x: x,
                      routed_scaling_factor=2.5)
    torch.testing.assert_close(scaled, 2.5 * base + shared, atol=1e-5, rtol=1e-5)
