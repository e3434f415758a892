"""Compiled passes for exact shapes (the attention residual's: `fused.py`, `counterfactual.py` and the RMSNorm of
`naive.py` it uses): each body compiled by inductor once per input signature, then called without any guard
evaluation. The toggled mechanisms' passes are compiled for any token count instead (`dynamic.py`).

A body is traced with fake tensors (so tracing touches no real state) into an aten graph and compiled by
`torch._inductor.compile`. Calls look the compiled graph up by the tensors' shapes, strides, dtypes,
devices and alignment and by the values of the non-tensor arguments: a dict lookup, as a serving engine
calls graphs it captured ahead, instead of torch.compile's per-call guard checks, which cost more than the
whole pass at decode sizes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

# Kernels visible to torch.profiler; a loop runs on several threads only past ATen's grain size (32768
# elements), as eager ops do, instead of inductor's default of 512 per thread.
INDUCTOR_OPTIONS = {"cpp.enable_kernel_profile": True, "cpp.min_chunk_size": 32768}
ALIGNMENT = 16


def _signature(arg: Any) -> tuple:
    if isinstance(arg, torch.Tensor):
        return (arg.shape, arg.stride(), arg.dtype, arg.device, arg.data_ptr() % ALIGNMENT)
    return ("constant", type(arg), arg)


def trace(body: Callable, args: Sequence[Any]) -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """`body(*args)` as an aten graph of its tensor arguments (the rest baked in as constants), returning what
    `body` returns."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def bound(*tensors: torch.Tensor) -> Any:
        full = list(args)
        for i, t in zip(positions, tensors, strict=True):
            full[i] = t
        return body(*full)

    tensors = [args[i] for i in positions]
    return make_fx(bound, tracing_mode="fake")(*tensors), tensors


def _generated(graph: Callable) -> Callable[[list[torch.Tensor]], Any]:
    """The generated `call(args)` itself, past inductor's per-call wrapper (~5 us of input checks the
    signature's alignment term already settles), else the wrapper."""
    call = getattr(graph, "current_callable", None)
    return call if call is not None else lambda tensors: graph(*tensors)


class FusedPass:
    """`body` compiled for each distinct input signature on first use; the body's results are what it writes
    in place. The tensors it writes must not overlap any other argument (the graph assumes they do not)."""

    def __init__(self, body: Callable) -> None:
        self.body = body
        self._graphs: dict[tuple, Callable[[list[torch.Tensor]], Any]] = {}

    def __call__(self, *args: Any) -> None:
        key = tuple(map(_signature, args))
        graph = self._graphs.get(key)
        if graph is None:
            gm, tensors = trace(self.body, args)
            graph = self._graphs[key] = _generated(torch._inductor.compile(gm, tensors, options=INDUCTOR_OPTIONS))
        graph([a for a in args if isinstance(a, torch.Tensor)])

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)


@functools.cache
def compiled(body: Callable) -> FusedPass:
    """The one FusedPass of `body` in this process."""
    return FusedPass(body)
