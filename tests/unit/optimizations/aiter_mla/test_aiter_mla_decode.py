"""Off (the split-KV decode, at several tilings) and the gather reference against the float64 un-absorbed reference,
on fresh random inputs with a fixed seed. vLLM's kernel (on, CPU) is tested the same way in test_aiter_mla_vllm_cpu.py.

Tolerance, |out - ref| <= atol + rtol * |ref|: float32 atol = rtol = 1e-5 (observed errors ~1e-6);
bfloat16 atol = rtol = 2e-2 (one bf16 rounding of the output is up to 0.4% of it, plus bf16 scores and
probabilities in split-KV; observed max 1.4e-2 for off, 9.8e-3 for the gather reference, |ref| up to 4.2).
"""

from __future__ import annotations

import functools

import pytest
import torch

from opts.aiter_mla import AiterMLAConfig, DecodeInputs, make_decode, make_inputs, naive, reference, split_kv

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}

DECODES = {
    "off": make_decode(AiterMLAConfig(mode="off"), "cpu"),
    # Small tiles and one tile per wave: many tiles per request, every wave its own pass, the merge exercised.
    "off_small_tiles": functools.partial(naive.decode, tiling=split_kv.Tiling(tile_tokens=32, stage_bytes=1)),
    # Small tiles, several per wave: the batched (bmm) wave path with partial tiles inside a wave.
    "off_batched_waves": functools.partial(naive.decode, tiling=split_kv.Tiling(tile_tokens=64, stage_bytes=1 << 20)),
    "gather_reference": reference.gather_decode,
}

CASES = {
    # name: (context_lens, block_size, shuffled)
    "context_1": ([1], 16, True),
    "not_block_multiple": ([37, 100], 16, True),
    "mixed_shuffled": ([1, 17, 300, 1000, 64], 16, True),
    "contiguous_table": ([200, 513], 64, False),
    "block_size_1": ([129, 3], 1, True),
    "long_and_short": ([2100, 77], 64, True),
    "odd_block_size": ([50, 7, 99], 7, True),
}


@functools.cache
def case_inputs(case: str, dtype: torch.dtype) -> tuple[DecodeInputs, torch.Tensor]:
    """The inputs of a case (every unused cache slot NaN) and their reference output, built once."""
    lens, block_size, shuffle = CASES[case]
    inputs = make_inputs(lens, block_size=block_size, dtype=dtype, shuffle=shuffle, spare_blocks=3,
                         poison_unused=True, seed=1234)
    return inputs, reference.decode(*inputs.args())


def assert_matches_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    atol, rtol = TOLERANCE[dtype]
    assert out.dtype == dtype
    assert torch.isfinite(out).all(), "unwritten (NaN) or non-finite output elements"
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("impl", list(DECODES))
def test_decode_matches_float64_reference(impl: str, case: str, dtype: torch.dtype) -> None:
    inputs, ref = case_inputs(case, dtype)
    out = inputs.empty_out()  # NaN: an element the decode does not write fails the check
    result = DECODES[impl](*inputs.args(), out=out)
    assert result.data_ptr() == out.data_ptr()
    assert_matches_reference(out, ref, dtype)


@pytest.mark.parametrize("impl", list(DECODES))
def test_decode_without_out_allocates_the_result(impl: str) -> None:
    inputs = make_inputs([40, 3], block_size=16, dtype=torch.float32, seed=7)
    result = DECODES[impl](*inputs.args())
    assert result.shape == (2, 12, 128)
    assert_matches_reference(result, reference.decode(*inputs.args()), torch.float32)


def test_reference_checks_absorption() -> None:
    # A decode that skipped W_UK (used q_nope as if it were already absorbed) must fail the reference.
    inputs = make_inputs([64], block_size=16, dtype=torch.float32, seed=3)
    w_uk_identity_like = torch.zeros_like(inputs.w_uk)
    w_uk_identity_like[:, :, :128] = torch.eye(128)
    wrong = naive.decode(inputs.q_nope, inputs.q_pe, inputs.kv_cache, inputs.block_table, inputs.context_lens,
                         w_uk_identity_like, inputs.w_uv)
    ref = reference.decode(*inputs.args())
    assert (wrong.double() - ref).abs().max() > 1e-2


def test_reference_is_the_plain_attention_formula() -> None:
    # One request, one head's worth of arithmetic written out, to pin the reference itself.
    inputs = make_inputs([5], block_size=2, dtype=torch.float64, shuffle=False, seed=5)
    ref = reference.decode(*inputs.args())
    lat = inputs.kv_cache.reshape(-1, 576)[:5]
    c, k_pe = lat[:, :512], lat[:, 512:]
    h = 3
    k = torch.cat([c @ inputs.w_uk[h].T, k_pe], dim=1)
    v = c @ inputs.w_uv[h].T
    q = torch.cat([inputs.q_nope[0, h], inputs.q_pe[0, h]])
    p = torch.softmax(k @ q / 192 ** 0.5, dim=0)
    torch.testing.assert_close(ref[0, h], p @ v)


def test_every_decode_on_a_larger_mixed_batch() -> None:
    inputs = make_inputs([2000, 1, 1100, 256, 777], block_size=64, dtype=torch.bfloat16, seed=99)
    ref = reference.decode(*inputs.args())
    for impl, decode in DECODES.items():
        out = inputs.empty_out()
        decode(*inputs.args(), out=out)
        assert torch.isfinite(out).all(), impl
        assert_matches_reference(out, ref, torch.bfloat16)


@pytest.mark.parametrize("impl", list(DECODES))
def test_bad_inputs_are_named(impl: str) -> None:
    decode = DECODES[impl]
    inputs = make_inputs([20, 30], block_size=16, dtype=torch.float32)
    args = list(inputs.args())
    bad_lens = list(args)
    bad_lens[4] = torch.tensor([0, 30], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"context_lens\[0\]: invalid value 0"):
        decode(*bad_lens)
    too_long = list(args)
    too_long[4] = torch.tensor([20, 33], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"context_lens\[1\]: invalid value 33"):
        decode(*too_long)
    bad_table = list(args)
    bad_table[3] = inputs.block_table.clone()
    bad_table[3][0, 0] = 999
    with pytest.raises(ValueError, match="block_table: block id 999"):
        decode(*bad_table)
    bad_shape = list(args)
    bad_shape[5] = inputs.w_uk[:, :64]
    with pytest.raises(ValueError, match=r"w_uk: shape \[12, 64, 512\]"):
        decode(*bad_shape)
    with pytest.raises(ValueError, match="out: dtype"):
        decode(*args, out=inputs.empty_out().double())
