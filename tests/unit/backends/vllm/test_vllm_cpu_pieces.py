"""The fan-in loader, the tolerant Triton-override rebinding, AttnRes against the project's float64 reference
(against vLLM's kernel: test_vllm_cpu_small_kernels.py)."""

from __future__ import annotations

import math
import sys
import types

import torch

from ablations.backends.vllm.in_vllm.cpu import loader
from ablations.backends.vllm.in_vllm.cpu.triton_dispatch import rebind_kernels


def test_fan_in_init_is_seeded_and_scaled():
    w1, w2, w3 = torch.empty(256, 400), torch.empty(256, 400), torch.empty(256, 400)
    loader.init_tensor("layers.0.mlp.down_proj.weight", w1, seed=0)
    loader.init_tensor("layers.0.mlp.down_proj.weight", w2, seed=0)
    loader.init_tensor("layers.1.mlp.down_proj.weight", w3, seed=0)
    assert torch.equal(w1, w2) and not torch.equal(w1, w3)
    assert abs(w1.std().item() - 1 / math.sqrt(400)) < 0.002
    a_log = torch.empty(4)
    loader.init_tensor("self_attn.A_log", a_log, seed=0)
    assert bool(((a_log >= 0) & (a_log <= math.log(16))).all())


def test_rebind_skips_objects_whose_dict_is_not_a_dict():
    class OddDict:
        @property
        def __dict__(self):
            return ()

    def kernel():
        return "old"

    def new():
        return "new"

    holder = types.SimpleNamespace(kernel=kernel)
    module = types.ModuleType("k3_rebind_probe")
    module.kernel, module.holder, module.odd = kernel, holder, OddDict()
    sys.modules[module.__name__] = module
    try:
        rebind_kernels([(kernel, new)])
    finally:
        del sys.modules[module.__name__]
    assert module.kernel is new and holder.kernel is new


def test_attn_res_matches_the_float64_reference():
    from ablations.backends.vllm.in_vllm.cpu.attn_res import attn_res
    from opts.fusion.inputs import AttnResLayer, AttnResStep
    from opts.fusion.reference import attn_res_reference

    g = torch.Generator().manual_seed(0)
    T, blocks_max, hidden = 5, 3, 16
    layer = AttnResLayer(torch.rand(hidden, generator=g) + 0.5, torch.randn(hidden, generator=g),
                         torch.rand(hidden, generator=g) + 0.5)
    for num_blocks, write_idx, with_delta in ((0, 0, False), (1, -1, True), (2, 2, True)):
        prefix, blocks = torch.randn(T, hidden, generator=g), torch.randn(T, blocks_max, hidden, generator=g)
        delta = torch.randn(T, hidden, generator=g) if with_delta else None
        step = AttnResStep(prefix.clone(), blocks.clone(), delta, num_blocks, write_idx)
        want_out, want_prefix, want_blocks = attn_res_reference(layer, step)
        got = attn_res(prefix, delta, blocks, layer.res_norm_weight, layer.res_proj_weight, layer.out_norm_weight,
                       num_blocks, write_idx, layer.eps, layer.out_eps)
        torch.testing.assert_close(got.double(), want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(prefix.double(), want_prefix, atol=1e-6, rtol=0)
        torch.testing.assert_close(blocks.double(), want_blocks, atol=1e-6, rtol=0)
