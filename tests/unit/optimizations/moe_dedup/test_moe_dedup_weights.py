"""The layer's sizes and weights: validation names the field, the splits rebuild the whole layer, the reference
routing is the top-k of the scores plus bias."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opts.k3 import K3, K3_TINY
from opts.moe_dedup.experts import route
from opts.moe_dedup.reference import reference_gates
from opts.moe_dedup.shape import K3_MOE, K3_MOE_BENCH, TEST_SHAPE
from opts.moe_dedup.weights import (
    ExpertWeights,
    MlpWeights,
    random_weights,
    shard_expert_parallel,
    shard_tensor_parallel,
)


def test_k3_shapes() -> None:
    assert (K3.moe_intermediate, K3_TINY.moe_intermediate) == (3072, 128)
    assert (K3_MOE.hidden, K3_MOE.latent, K3_MOE.num_experts, K3_MOE.top_k) == (7168, 3584, 896, 16)
    assert (K3_MOE.moe_intermediate, K3_MOE.shared_intermediate) == (3072, 6144)
    assert (K3_MOE_BENCH.num_experts, K3_MOE_BENCH.top_k, K3_MOE_BENCH.shared_intermediate) == (16, 2, 6144)
    assert K3_MOE.check_world_size(8, split_hidden=True, expert_parallel=True) == 8


def test_bad_shapes_are_named() -> None:
    with pytest.raises(ValueError, match=r"MoeShape.latent: invalid value 0; valid: an integer >= 1"):
        dataclasses.replace(TEST_SHAPE, latent=0)
    with pytest.raises(ValueError, match=r"MoeShape.top_k: invalid value 9; valid: 1..num_experts \(8\)"):
        dataclasses.replace(TEST_SHAPE, top_k=9)
    with pytest.raises(ValueError, match=r"MoeShape.routed_scaling_factor: invalid value nan"):
        dataclasses.replace(TEST_SHAPE, routed_scaling_factor=float("nan"))
    with pytest.raises(ValueError, match=r"world_size: invalid value 3; it must divide moe_intermediate \(64\); "
                                         r"valid: one of \[1, 2, 4, 8, 16, 32, 64\]"):
        TEST_SHAPE.check_world_size(3)


def test_bad_weights_are_named() -> None:
    w = random_weights(TEST_SHAPE, 0)
    with pytest.raises(ValueError, match=r"MoeWeights.up: shape \(128, 256\); valid: \(256, 128\)"):
        dataclasses.replace(w, up=w.up.t())
    with pytest.raises(ValueError, match=r"MoeWeights.norm: dtype torch.float64; valid: torch.float32"):
        dataclasses.replace(w, norm=w.norm.double())
    with pytest.raises(ValueError, match=r"ExpertWeights.down: shape"):
        ExpertWeights(w.experts.gate, w.experts.up, w.experts.up)
    with pytest.raises(ValueError, match=r"MlpWeights.down: shape"):
        MlpWeights(w.shared.gate, w.shared.up, w.shared.gate)
    with pytest.raises(ValueError, match=r"MoeWeights.experts: experts 4..11"):
        dataclasses.replace(w, experts=dataclasses.replace(w.experts, first=4))
    with pytest.raises(ValueError, match=r"rank: invalid value 2; valid: 0..1"):
        shard_tensor_parallel(w, TEST_SHAPE, 2, 2)


def test_splits_rebuild_the_layer() -> None:
    w = random_weights(TEST_SHAPE, 1)
    assert torch.equal(random_weights(TEST_SHAPE, 1).experts.down, w.experts.down)
    tp = [shard_tensor_parallel(w, TEST_SHAPE, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([s.experts.gate for s in tp], 1), w.experts.gate)
    assert torch.equal(torch.cat([s.experts.down for s in tp], 2), w.experts.down)
    assert torch.equal(torch.cat([s.shared.up for s in tp], 0), w.shared.up)
    assert torch.equal(torch.cat([s.shared.down for s in tp], 1), w.shared.down)
    assert all(s.up is w.up and s.experts.first == 0 for s in tp)
    ep = [shard_expert_parallel(w, TEST_SHAPE, r, 4) for r in range(4)]
    assert [s.experts.first for s in ep] == [0, 2, 4, 6]
    assert torch.equal(torch.cat([s.experts.up for s in ep], 0), w.experts.up)
    assert all(s.shared is w.shared for s in ep)


def test_route_picks_the_reference_experts() -> None:
    w = random_weights(TEST_SHAPE, 2)
    x = torch.randn(50, TEST_SHAPE.hidden, generator=torch.Generator().manual_seed(3))
    ids, gates = route(x, w.router, w.router_bias, 2)
    dense = reference_gates(x, w.router, w.router_bias, 2)
    assert torch.equal(torch.sort(ids, -1).values, torch.sort(torch.topk(dense, 2, -1).indices, -1).values)
    torch.testing.assert_close(gates.double(), dense.gather(-1, ids), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(gates.sum(-1), torch.ones(50))
    assert gates.dtype == torch.float32
