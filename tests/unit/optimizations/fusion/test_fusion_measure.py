"""The instruments themselves, on ops whose traffic is known by hand."""

from __future__ import annotations

import torch

from opts.fusion.bench.measured_traffic import count_ops, profile_call, tensor_bytes


def test_count_ops_reads_inputs_writes_outputs_and_skips_views():
    x, y = torch.ones(4, 8), torch.ones(4, 8)
    out = torch.empty(4, 8)
    traffic = count_ops(lambda: (x.view(8, 4), x + y, x.add_(y), out.copy_(y), torch.mul(x, 2, out=out)))
    assert [op.name for op in traffic.ops] == ["add", "add_", "copy_", "mul"]
    assert [(op.read, op.written) for op in traffic.ops] == [(256, 128), (256, 128), (128, 128), (128, 128)]
    assert (traffic.allocations, traffic.allocated) == (1, 128)


def test_count_ops_counts_broadcast_and_repeated_inputs_once():
    x, w = torch.ones(16, 8), torch.ones(8)
    traffic = count_ops(lambda: (x * x, x * w.expand(16, 8)))
    assert [(op.read, op.written) for op in traffic.ops] == [(512, 512), (512 + 32, 512)]
    assert tensor_bytes(w.expand(16, 8)) == 32


def test_profile_call_counts_top_level_data_ops_only():
    x = torch.ones(64, 64)
    profiled = profile_call(lambda: (x.view(-1), x.float(), x.pow(2).mean(-1), x.to(torch.float64)))
    assert profiled.kernels == ("aten::pow", "aten::mean", "aten::to")
    assert profiled.allocated >= 64 * 64 * 4 + 64 * 4 + 64 * 64 * 8
