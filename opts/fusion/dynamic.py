"""Compiled passes whose token count varies from call to call, as inside a serving engine.

`compiled.py` compiles one graph per exact input signature, right for a microbenchmark's fixed shapes; in
an engine the token count changes every step (1..max_num_seqs decodes, prefill chunks up to the token budget),
which would compile one graph per count, seconds each. `DynamicPass` compiles the same kind of body with
torch.compile (inductor, `compiled.INDUCTOR_OPTIONS`), the token dim (dim 0 of the arguments named as
per-token) symbolic: one graph for one token (torch specialises size 1) and one for every count >= 2, per
signature of the other sizes, strides and dtypes. A call pays torch.compile's guard check (microseconds).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opts.fusion.compiled import INDUCTOR_OPTIONS


class DynamicPass:
    """`body` compiled with dim 0 of the tensor arguments at positions `token_args` dynamic.

    `num_graphs` counts the graphs inductor compiled for it in this process.
    """

    def __init__(self, body: Callable, token_args: Sequence[int]) -> None:
        self.body = body
        self.token_args = tuple(token_args)
        self.num_graphs = 0
        self._fn = torch.compile(body, backend=self._compile, fullgraph=True, dynamic=False)

    def _compile(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        self.num_graphs += 1
        return compile_fx(gm, example_inputs, config_patches=INDUCTOR_OPTIONS)

    def __call__(self, *args: Any) -> Any:
        for i in self.token_args:
            torch._dynamo.maybe_mark_dynamic(args[i], 0)
        return self._fn(*args)


@functools.cache
def dynamic(body: Callable, token_args: tuple[int, ...]) -> DynamicPass:
    """The one DynamicPass of `body` in this process (torch.compile caches graphs per body's code)."""
    return DynamicPass(body, token_args)
