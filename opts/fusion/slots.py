"""vLLM's state slot pools as the engine passes read and write them (on: `passes.py`, off: `naive.py`).

A decode row's conv window and recurrent state live in pools [slots, ...] at the row's slot index; an index
<= 0 is vLLM's null block (a padded or finished row): its output is zero and no live slot changes, as
vLLM-CPU's kernels (CPU fixes S4, S8) treat it. Inside a compiled pass a row reads its slot (`gather`, a null
row reads slot 0) and the pass returns the new rows, null rows as they were (`keep_null`); after the pass
`store` scatters them back (the null slot gets back what it held). Why after the pass: vLLM's conv and
recurrent pools are two views of one cache storage with different bases, which aot_autograd cannot mutate as
two graph inputs ("non-differentiable view input mutations"); inside one graph inductor would stage the new
rows in a buffer before scattering them anyway (it cannot prove the slots distinct). `run_step` is the
entry both decode steps share: the shape checks, a single sequence as two rows, no sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from opts.fusion.checks import check_kda_decode_slots
from opts.fusion.dynamic import as_two_rows

# A decode step's arguments (`passes.kda_decode_slots_fused`, `naive.kda_decode_slots_unfused`): x, raw_g,
# raw_beta, slots, gate and out have one row per sequence; out is written.
STEP_TOKEN_ARGS = (0, 3, 4, 8, 9, 11)
STEP_OUT = 11


def gather(slots: torch.Tensor, *pools: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(live [N] bool, idx [N] int64, each pool's rows at idx); a null row reads slot 0."""
    live = slots > 0
    idx = torch.where(live, slots, 0).long()
    return live, idx, [pool[idx] for pool in pools]


def _rows(live: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return live.view(-1, *([1] * (x.dim() - 1)))


def keep_null(live: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The rows to store: `new` (in the pool's dtype) for live rows, `old` for null ones."""
    return torch.where(_rows(live, old), new.to(old.dtype), old)


def zero_null(live: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`x` with the rows of null slots zero."""
    return torch.where(_rows(live, x), x, 0.0)


def store(idx: torch.Tensor, pools: Sequence[torch.Tensor], rows: Sequence[torch.Tensor]) -> None:
    """Scatter each pool's new rows back to their slots, in place."""
    for pool, new in zip(pools, rows, strict=True):
        pool[idx] = new


def run_step(step: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """Check a decode step's arguments and run `step(*args)`: one sequence as two equal rows
    (`dynamic.as_two_rows`), none not at all. Returns out."""
    check_kda_decode_slots(*args)
    if args[0].shape[0] == 1:
        return as_two_rows(step, args, STEP_TOKEN_ARGS, STEP_OUT)
    return step(*args) if args[0].shape[0] else args[STEP_OUT]
