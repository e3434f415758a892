"""The CPU path's smaller replacements: MLA epilogues, synthetic rejection sampling, align-mode state moves,
the fan-in loader, the tolerant Triton-override rebinding."""

from __future__ import annotations

import math
import sys
import types

import torch

from ablations.backends.vllm.cpu import loader, mamba_align, mla, sampling
from ablations.backends.vllm.cpu.triton_dispatch import rebind_kernels


def test_mla_prefill_epilogue_concats_key_and_inserts_latent():
    T, Hh, nope, rope, L = 5, 3, 4, 2, 6
    g = torch.Generator().manual_seed(0)
    k_nope, k_pe = torch.randn(T, Hh, nope, generator=g), torch.randn(T, 1, rope, generator=g)
    kv_c = torch.randn(T, L, generator=g)
    cache = torch.zeros(4, 4, L + rope)
    slots = torch.tensor([5, 6, -1, 0, 15])
    k = mla.fused_mla_key_concat_kv_cache_insert(None, k_nope, k_pe, kv_c, cache, slots)
    assert torch.equal(k[:, :, :nope], k_nope) and torch.equal(k[:, 1, nope:], k_pe[:, 0])
    flat = cache.view(-1, L + rope)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat[slot], torch.cat([kv_c[t], k_pe[t, 0]]))
    assert flat.abs().sum(-1).nonzero().flatten().tolist() == [0, 5, 6, 15]


def test_mla_decode_epilogue_returns_the_latent_query():
    ql, qpe = torch.randn(2, 3, 6), torch.randn(2, 3, 2)
    cache = torch.zeros(2, 4, 8)
    q = mla.fused_mla_decode_q_concat_kv_cache_insert(ql, qpe, torch.randn(2, 6), torch.randn(2, 2), cache,
                                                      torch.tensor([1, 7]))
    assert torch.equal(q, torch.cat([ql, qpe], -1)) and cache.view(-1, 8)[[1, 7]].abs().sum() > 0


def test_q_kv_rmsnorm():
    x, y, w1, w2 = torch.randn(3, 8), torch.randn(3, 4), torch.rand(8), torch.rand(4)
    a, b = mla.fused_q_kv_rmsnorm(x, y, w1, w2, 1e-6)
    torch.testing.assert_close(a, x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w1)
    torch.testing.assert_close(b, y / y.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w2)


def test_synthetic_greedy_rejection_accepts_by_rate_then_falls_back():
    out = torch.full((2, 3), -1, dtype=torch.int32)
    cu = torch.tensor([2, 4])
    drafts = torch.tensor([11, 12, 21, 22])
    target = torch.tensor([91, 92, 93, 94])
    bonus = torch.tensor([100, 200])
    uniform = torch.tensor([0.1, 0.1, 0.1, 0.9], dtype=torch.float64)
    rates = torch.tensor([0.5, 0.5])
    sampling.rejection_greedy_sample(out, cu, drafts, target, bonus, None, 2, uniform, rates, SYNTHETIC_MODE=True)
    assert out.tolist() == [[11, 12, 100], [21, 94, -1]]


def test_align_moves_conv_windows_and_recurrent_states():
    """Precopy: conv window shifted by the accepted bias; recurrent state taken from column src+bias."""
    blocks, width, dim = 6, 4, 3
    conv = torch.arange(blocks * width * dim, dtype=torch.float32).view(blocks, width, dim)
    ssm = torch.arange(blocks * 5, dtype=torch.float32).view(blocks, 5)
    conv0, ssm0 = conv.clone(), ssm.clone()
    table = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
    layout = dict(
        block_table_ptrs=torch.tensor([table.data_ptr()]), block_table_stride_req=4,
        state_base_addrs=torch.tensor([conv.data_ptr(), ssm.data_ptr()]),
        state_block_strides=torch.tensor([conv.stride(0) * 4, ssm.stride(0) * 4]),
        state_elem_sizes=torch.tensor([4, 4]), state_inner_sizes=torch.tensor([conv.stride(1), 5]),
        state_conv_widths=torch.tensor([width, 0]), state_group_indices=torch.tensor([0, 0]),
        state_dim_row_count=torch.zeros(2, dtype=torch.int32), state_dim_row_stride=torch.zeros(2, dtype=torch.int64),
    )
    mamba_align.precopy_mamba_align_fused_kernel(
        torch.tensor([3]), torch.tensor([0]), torch.tensor([1]), idx_mapping=None, num_reqs=1,
        HAS_IDX_MAPPING=False, **layout,
    )
    assert torch.equal(conv[4, : width - 1], conv0[1, 1:]) and torch.equal(ssm[4], ssm0[2])
    assert torch.equal(conv[:4], conv0[:4]) and torch.equal(ssm[:4], ssm0[:4])


def test_postprocess_saves_the_boundary_state_into_the_closing_block():
    """16-token blocks, 2 drafts: running state at 15 tokens, 2 accepted -> position 16 is saved in block 0."""
    ssm = torch.arange(4 * 2, dtype=torch.float32).view(4, 2)
    ssm0 = ssm.clone()
    table = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    out = torch.zeros(1, dtype=torch.int32)
    mamba_align.postprocess_mamba_fused_kernel(
        torch.tensor([2]), torch.tensor([0]), torch.tensor([3]), torch.tensor([14]), torch.tensor([2]),
        torch.tensor([table.data_ptr()]), 3, torch.tensor([ssm.data_ptr()]), torch.tensor([8]), torch.tensor([4]),
        torch.tensor([2]), torch.tensor([0]), torch.tensor([0]), torch.zeros(1, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int64), out, None, 1, block_size=16,
    )
    # running = 14 + 3 - 2 = 15 tokens; new computed 16 -> bias 1: column 0+1 (block 2) copied to column 0 (block 1)
    assert torch.equal(ssm[1], ssm0[2]) and out.tolist() == [1]


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
    from ablations.backends.vllm.cpu.attn_res import attn_res
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
