"""Compiled passes whose token count varies from call to call, as inside a serving engine.

`compiled.py` compiles one graph per exact input signature, right for a microbenchmark's fixed shapes; in
an engine the token count changes every step (1..max_num_seqs decodes, prefill chunks up to the token budget),
which would compile one graph per count, seconds each. `DynamicPass` compiles the same kind of body with
torch.compile (inductor, `compiled.INDUCTOR_OPTIONS`), the token dim (dim 0 of the arguments named as
per-token) dynamic: one graph for every count >= 2, per signature of the other sizes, the strides and the
dtypes; `widths` makes further dims dynamic (one graph for RMSNorms of several widths). torch specialises a
size of 1, which would cost every pass a second graph: a one-row step runs as two equal rows instead
(`as_two_rows`, doing the row's work twice). Not an unbacked token dim, which serves 1 with the same graph:
inductor's code for it ran the KDA decode 1.5-1.9x slower (README.md). A call pays torch.compile's guard
check and wrappers (tens of microseconds, README.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from opts.fusion.compiled import INDUCTOR_OPTIONS


class DynamicPass:
    """`body` compiled with dim 0 of the tensor arguments at positions `token_args` dynamic, and the dims
    `widths` ((argument, dim) pairs) too.

    `num_graphs` counts the graphs inductor compiled for it in this process.
    """

    def __init__(self, body: Callable, token_args: Sequence[int], widths: Sequence[tuple[int, int]] = ()) -> None:
        self.body = body
        self.dims = tuple((i, 0) for i in token_args) + tuple(widths)
        self.num_graphs = 0
        self._fn = torch.compile(body, backend=self._compile, fullgraph=True, dynamic=False)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        self.num_graphs += 1
        return compile_fx(gm, example_inputs, config_patches=INDUCTOR_OPTIONS)

    def __call__(self, *args: Any) -> Any:
        args = list(args)
        for i in {i for i, _ in self.dims}:
            args[i] = args[i][...]          # an alias: the marks stay off the caller's tensor
        for i, dim in self.dims:
            torch._dynamo.maybe_mark_dynamic(args[i], dim)
        if not torch._C._len_torch_dispatch_stack():
            return self._fn(*args)
        with _disable_current_modes():    # past the dispatcher, as compiled.py's passes: modes see no op inside
            return self._fn(*args)


def dynamic(body: Callable, token_args: Sequence[int], widths: Sequence[tuple[int, int]] = ()) -> DynamicPass:
    """The one DynamicPass of `body` in this process (torch.compile caches graphs per body's code)."""
    return _dynamic(body, tuple(token_args), tuple(widths))


@functools.cache
def _dynamic(body: Callable, token_args: tuple[int, ...], widths: tuple[tuple[int, int], ...]) -> DynamicPass:
    return DynamicPass(body, token_args, widths)


def two_rows(t: torch.Tensor) -> torch.Tensor:
    """The one-row `t` as two equal rows, in new memory laid out as t's: its strides and its storage offset,
    which the graph compiled for the other counts holds too (it guards both)."""
    shape = (2, *t.shape[1:])
    extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(shape, t.stride(), strict=True)) + 1
    out = t.new_empty(extent).as_strided(shape, t.stride(), t.storage_offset())
    out.copy_(t.expand(shape))
    return out


def as_two_rows(fn: Callable, args: Sequence[Any], token_args: Sequence[int], out: int | None = None) -> Any:
    """`fn(*args)` for a one-row step, run on two equal rows: the per-token arguments `token_args` doubled
    (`two_rows`); then row 0 of the argument `out` copied back and `args[out]` returned, or, without `out`,
    row 0 of each tensor `fn` returns. A slot written by both rows gets the same values twice."""
    padded = list(args)
    for i in token_args:
        padded[i] = two_rows(args[i])
    result = fn(*padded)
    if out is not None:
        args[out].copy_(padded[out][:1])
        return args[out]
    return tuple(r[:1] for r in result)
