"""The benchmark cases' pairs at small shapes: fresh states on the first call, states among the outputs, on
within the case's tolerance of off (the harness's own check), and a wrong on caught by that tolerance."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from opts.base import BenchPair
from opts.bench import checked_pair, output_tensors
from opts.fusion import decode_args, kda_decode_slots_fused, kda_decode_slots_unfused, make_kda_decode
from opts.fusion.cases import DTYPE, attn_res_case, kda_decode_case, mla_norm_case
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape

CASES = [
    kda_decode_case(KdaDecodeShape(2, num_heads=5, head_dim=16), "cpu"),
    mla_norm_case(MlaNormShape(3, 96, 40, 8), "cpu"),
    attn_res_case(AttnResShape(3, 3, hidden=48, max_blocks=5, has_delta=True), "cpu"),
    attn_res_case(AttnResShape(2, 2, hidden=48, max_blocks=5, has_delta=False, block_write=True), "cpu"),
]
OUTPUTS = {"kda_decode": 3, "mla_norm": 2, "attn_res": 3}
# Each test compiles its passes with torch.compile (seconds apiece): the full tier only (`make test`).
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_first_call_of_on_matches_off_within_the_case_tolerance(case):
    pair, worst = checked_pair(case, "cpu")
    assert worst <= case.atol + case.rtol * 8
    outputs = output_tensors(pair.off())
    assert len(outputs) == OUTPUTS[case.info["mechanism"]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_wrong_on_is_caught(case):
    pair = case.setup()

    def wrong():
        first, *rest = pair.on()
        return (first * (1 + 4 * case.rtol) + case.atol, *rest)

    broken = dataclasses.replace(case, setup=lambda: BenchPair(off=pair.off, on=wrong))
    with pytest.raises(AssertionError, match="on != off"):
        checked_pair(broken, "cpu")


def test_states_are_fresh_on_the_first_call():
    """Setup compiles both paths on throwaway copies: the pair's first calls start from the initial states."""
    shape = KdaDecodeShape(2, num_heads=5, head_dim=16)
    pair = kda_decode_case(shape, "cpu").setup()
    layer, step = make_kda_decode(shape, DTYPE, "cpu")
    for name, path, run in (("off", kda_decode_slots_unfused, pair.off), ("on", kda_decode_slots_fused, pair.on)):
        s = step.clone()
        expected = (path(*decode_args(layer, s, torch.empty(2, 5, 16, dtype=DTYPE))), s.conv_pool, s.state_pool)
        for (what, got), (_, want) in zip(output_tensors(run()), output_tensors(expected), strict=True):
            assert torch.equal(got, want), f"{name} {what}"
