"""Shared by fusion's unit tests: tolerances against the float64 reference, NaN-filled allocations, vLLM."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# (atol, rtol) of an output against float64. bf16 outputs carry one bf16 rounding (2^-8 relative) plus,
# on the off path, the roundings between its stages (bf16 conv output, bf16 recurrent output, bf16 mix).
OUT_TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (3e-2, 2e-2)}
# The fp32 recurrent state: in a bf16 step it inherits the rounding of the bf16 inputs q, k, v.
STATE_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 1e-2)}
_ALLOCS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
# An engine compiles each pass for one signature (dtype, head count, gate form, ...); these tests compile the
# same passes for many in one process, past torch.compile's default limit of 8 graphs per pass.
torch._dynamo.config.recompile_limit = 64


def _check(actual: torch.Tensor, expected: torch.Tensor, tol: tuple[float, float], what: str) -> None:
    assert not torch.isnan(actual).any(), f"{what}: NaN in the result"
    atol, rtol = tol
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.fixture
def close_out() -> Callable[[torch.Tensor, torch.Tensor, torch.dtype, str], None]:
    """close_out(actual, reference, dtype, what): an output within OUT_TOL[dtype] of the float64 reference."""
    return lambda actual, expected, dtype, what: _check(actual, expected, OUT_TOL[dtype], what)


@pytest.fixture
def close_state() -> Callable[[torch.Tensor, torch.Tensor, torch.dtype, str], None]:
    """close_state(actual, reference, dtype, what): a state within STATE_TOL[dtype] of the float64 reference."""
    return lambda actual, expected, dtype, what: _check(actual, expected, STATE_TOL[dtype], what)


class NanAllocations(TorchDispatchMode):
    """Every floating-point tensor allocated by an eager op comes back filled with NaN, so a stage that leaves
    part of a fresh output unwritten shows up. Compiled passes must be compiled before entering."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in _ALLOCS and result.is_floating_point():
            result.fill_(float("nan"))
        return result


@pytest.fixture
def nan_allocations() -> type[NanAllocations]:
    """`with nan_allocations():` fills every fresh floating-point allocation of an eager op with NaN."""
    return NanAllocations


@pytest.fixture(scope="session")
def vllm():
    """vLLM with its C++ ops loaded (media wheels hidden first); skipped where vLLM is not installed."""
    from opts.vllm_import import hide_media_wheels

    hide_media_wheels()
    module = pytest.importorskip("vllm")
    pytest.importorskip("vllm._custom_ops")
    return module
