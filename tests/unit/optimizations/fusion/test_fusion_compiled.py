"""The compiled-pass cache: one graph per input signature, reused across calls."""

from __future__ import annotations

import torch

from opts.fusion import MlaNormShape, make_mla_norm, mla_norm_fused
from opts.fusion.compiled import _signature, compiled
from opts.fusion.fused import _mla_norm_body


def test_signature_tells_apart_what_changes_the_code():
    x = torch.ones(4, 8)
    assert _signature(x) == _signature(torch.zeros(4, 8))
    assert _signature(x) != _signature(torch.ones(4, 9))
    assert _signature(x) != _signature(torch.ones(8, 8)[::2])          # same shape, other strides
    assert _signature(x) != _signature(x.to(torch.bfloat16))
    assert _signature(None) != _signature(-5.0) != _signature(-4.0)


def test_same_signature_reuses_the_graph_and_writes_fresh_results():
    shape = MlaNormShape(3, 96, 40, 8)                                     # as in the correctness tests
    fused = compiled(_mla_norm_body)
    q_out = torch.empty(3, 96, dtype=torch.bfloat16)
    kv_out = torch.empty(3, 40, dtype=torch.bfloat16)
    layer, qkv = make_mla_norm(shape, torch.bfloat16, seed=1)
    mla_norm_fused(layer, qkv, q_out, kv_out)
    graphs = fused.num_graphs
    first = q_out.clone()
    _, qkv_other = make_mla_norm(shape, torch.bfloat16, seed=2)
    mla_norm_fused(layer, qkv_other, q_out, kv_out)
    assert fused.num_graphs == graphs
    assert not torch.equal(first, q_out)
