"""The sweeper of k3-ablate's multiruns (`hydra/sweeper=cells`, the app's default): Hydra's basic sweeper,
composing fewer jobs before it launches a batch.

Hydra's BasicSweeper composes every job of a batch in the parent before launching any
(`validate_batch_is_legal`), and its launcher composes each again where the job runs. A composition takes about
0.3 s here, so the main job with draws (64 cells x 17 draws) spent 5.8 min on them before its first cell started.
CellSweeper composes only the jobs that hold an override no earlier job held: every swept value is composed at
least once before anything runs, so a bad one still fails the sweep before its first cell (80 compositions for
that sweep). A value that fails only beside another fails when its job is launched, which stops the sweep (no
attribution at its end): the cells finished by then keep their results (written atomically), and a rerun skips
them.

The jobs run in Hydra's order (the product of the swept keys, the first varying slowest), except that the keys in
`outer` go first (by default `ablation.draw`, then `ablation.repeat`), so a sweep with
draws runs the point values' cells first, then each draw's cells in turn, and one cut short holds whole draws,
which the attribution uses (cell-major, no draw was complete before the last cell).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.types import Override

OUTER = ("ablation.draw", "ablation.repeat")


@dataclass     # no `from __future__ import annotations`: Hydra's plugin scan runs this module outside sys.modules
class CellSweeperConf:
    _target_: str = "hydra_plugins.k3_ablate.sweeper.CellSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    outer: list[str] = field(default_factory=lambda: list(OUTER))


ConfigStore.instance().store(group="hydra/sweeper", name="cells", node=CellSweeperConf, provider="k3_ablate")


def covering_jobs(batch: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """The jobs of `batch` (each a list of `key=value` overrides) holding an override no earlier job held, in
    batch order: every override of the batch is in one of them."""
    seen: set[str] = set()
    chosen = []
    for job in batch:
        if not seen.issuperset(job):
            chosen.append(job)
            seen.update(job)
    return chosen


def outer_first(overrides: Sequence[Override], outer: Sequence[str]) -> list[Override]:
    """`overrides` with the keys of `outer` first (`+key`, `++key` too), in `outer`'s order; the others after them,
    as they were."""
    rank = {key: i for i, key in enumerate(outer)}
    return sorted(overrides, key=lambda o: rank.get(o.get_key_element().lstrip("+~"), len(rank)))


class CellSweeper(BasicSweeper):
    """BasicSweeper validating a batch by composing its covering jobs only, the keys of `outer` varying slowest
    (module docstring)."""

    def __init__(self, max_batch_size: int | None, params: dict[str, str] | None = None,
                 outer: Sequence[str] = OUTER) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.outer = list(outer)

    def split_arguments(self, overrides: list[Override], max_batch_size: int | None) -> list[list[list[str]]]:
        return BasicSweeper.split_arguments(outer_first(overrides, self.outer), max_batch_size)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        super().validate_batch_is_legal(covering_jobs(batch))
