"""The compiled-pass cache: one graph per input signature, reused across calls."""

from __future__ import annotations

import torch

from opts.fusion import AttnResShape, attn_res_fused, make_attn_res
from opts.fusion.compiled import _signature, compiled
from opts.fusion.fused import _attn_res_body


def test_signature_tells_apart_what_changes_the_code():
    x = torch.ones(4, 8)
    assert _signature(x) == _signature(torch.zeros(4, 8))
    assert _signature(x) != _signature(torch.ones(4, 9))
    assert _signature(x) != _signature(torch.ones(8, 8)[::2])          # same shape, other strides
    assert _signature(x) != _signature(x.to(torch.bfloat16))
    assert _signature(None) != _signature(-5.0) != _signature(-4.0)


def test_same_signature_reuses_the_graph_and_writes_fresh_results():
    shape = AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True)   # as in the correctness tests
    fused = compiled(_attn_res_body)
    layer, step = make_attn_res(shape, torch.bfloat16, seed=1)
    first = attn_res_fused(layer, step.clone())
    graphs = fused.num_graphs
    _, other = make_attn_res(shape, torch.bfloat16, seed=2)
    second = attn_res_fused(layer, other.clone())
    assert fused.num_graphs == graphs
    assert not torch.equal(first, second)
