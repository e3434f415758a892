"""kda_overlap's Triton packed kernel under Triton's interpreter (TRITON_INTERPRET=1, set before triton is
first imported: test_kda_overlap_triton.py runs this file in its own process): the same function as on, against
the float64 reference and off, every output written (NaN-poisoned buffers), at the package's tolerances; fast
decays stay exact; bad shapes are named."""

from __future__ import annotations

import os

import pytest
import torch
from test_kda_overlap_step import (  # the package's checks, shared
    FIELDS,
    TOLERANCES,
    assert_matches,
    poisoned,
    reference_checkpoints,
)

from opts.kda_overlap import reference_step, step_off
from opts.kda_overlap.inputs import StepShape, random_step

F64 = torch.float64
# a one-token segment, a prefill over 5 chunks of 16 and one ending mid-chunk, a row with nothing to verify,
# rows of several lengths, 3 heads, dk != dv (powers of two: the kernel's tiles)
SHAPE = StepShape(prefill_lens=(1, 70, 37), verify_lens=(4, 0, 4, 3, 1, 4), num_heads=3, dk=32, dv=16)


@pytest.fixture(scope="module")
def kernel():
    """opts.kda_overlap.triton_packed in Triton's interpreter (test_kda_overlap_triton runs this file in a
    process started with TRITON_INTERPRET=1: triton reads it once, at its first import)."""
    from opts.kda_overlap import triton_packed

    assert os.environ.get("TRITON_INTERPRET") == "1" and triton_packed.interpreted()
    return triton_packed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_equals_the_float64_reference_and_off(kernel, dtype):
    batch = random_step(SHAPE, dtype=dtype, seed=11)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    got = kernel.packed_step(batch, out=poisoned(batch))
    assert got.o.dtype == dtype and got.verify_states.dtype == torch.float32
    assert_matches(got, ref, dtype)
    off = step_off(batch, out=poisoned(batch))
    for name in FIELDS:
        torch.testing.assert_close(getattr(got, name), getattr(off, name), rtol=2e-5, atol=TOLERANCES[dtype][0],
                                   msg=name)


def test_every_verification_position_keeps_its_own_state(kernel):
    """The state after each position of each row, not the row's last one repeated (nor the one before)."""
    batch = random_step(StepShape((), (4, 3), num_heads=2, dk=16, dv=16), seed=3)
    ref = reference_step(batch.to(F64, state_dtype=F64))
    got = kernel.packed_step(batch, out=poisoned(batch))
    assert_matches(got, ref, torch.float32)
    states = got.verify_states
    assert all((states[t] - states[t + 1]).abs().max() > 1e-3 for t in (0, 1, 2, 4, 5))


def test_fast_decay_and_long_segments_stay_exact(kernel):
    """Every exponent the kernel takes is <= 0, so a decay far past packed.py's factored span is exact too."""
    batch = random_step(StepShape((50, 16, 33), (4, 2), num_heads=2, dk=16, dv=32), seed=5, decay=25.0)
    assert float(batch.g.min()) < -40
    ref = reference_step(batch.to(F64, state_dtype=F64))
    assert_matches(kernel.packed_step(batch, out=poisoned(batch)), ref, torch.float32)


def test_single_kind_steps_and_a_fresh_out(kernel):
    for shape in (StepShape((40,), (), num_heads=1, dk=16, dv=16), StepShape((), (4, 4), num_heads=1, dk=16, dv=16)):
        batch = random_step(shape, seed=2)
        assert_matches(kernel.packed_step(batch), reference_step(batch.to(F64, state_dtype=F64)), torch.float32)


def test_bad_head_sizes_are_named(kernel):
    batch = random_step(StepShape((8,), (4,), num_heads=1, dk=24, dv=16), seed=1)
    with pytest.raises(ValueError, match=r"MixedStep\.dk: the Triton packed kernel needs a power of two >= 16, "
                                         r"got 24"):
        kernel.packed_step(batch)


def test_the_kernel_writes_each_checkpoint_from_the_same_pass(kernel):
    """A checkpoint mid-segment (64 of 70 tokens), one at a segment's end, one after the first chunk of 16; the
    segment without one leaves its row untouched; one a chunk off is another state; one off the grid is named."""
    batch = random_step(StepShape((70, 64, 37, 5), (4, 3), num_heads=2, dk=16, dv=32), seed=17)
    checkpoints = (64, 64, 16, 0)
    at = torch.full((4, 2, 16, 32), float("nan"))
    got = kernel.packed_step(batch, out=poisoned(batch), checkpoints=checkpoints, checkpoints_out=at)
    want, kept = reference_checkpoints(batch, checkpoints)
    torch.testing.assert_close(at[kept], want.float(), rtol=2e-5, atol=2e-5)
    assert torch.isnan(at[3]).all()
    assert_matches(got, reference_step(batch.to(F64, state_dtype=F64)), torch.float32)
    early, _ = reference_checkpoints(batch, (48, 64, 16, 0))
    assert (early[0].float() - at[0]).abs().max() > 1e-2
    with pytest.raises(ValueError, match=r"checkpoints\[0\]: invalid value 40; valid: 0, or a multiple of 16"):
        kernel.packed_step(batch, checkpoints=(40,), checkpoints_out=at)
