"""The app's sweeper (hydra_plugins/k3_ablate/sweeper.py): a batch is validated by composing only the jobs that
hold an override no earlier job held, so every swept value is composed before anything runs."""

from __future__ import annotations

import itertools

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.errors import ConfigCompositionException
from hydra.types import HydraContext
from test_experiments import composed

from ablations.config import CONF_DIR
from hydra_plugins.k3_ablate.sweeper import covering_jobs

CELLS = ["all_off", "fusion", "fusion+draft_length"]


def jobs(cells, draws):
    return [[f"ablation.cell={c}", f"ablation.draw={d}"] for c, d in itertools.product(cells, draws)]


def test_the_covering_jobs_hold_every_override_and_each_holds_a_new_one():
    batch = jobs(CELLS, range(-1, 3))
    chosen = covering_jobs(batch)
    assert chosen == [*batch[:4], batch[4], batch[8]]    # the first cell's four draws, then each other cell once
    assert {o for job in chosen for o in job} == {o for job in batch for o in job}
    assert covering_jobs([]) == [] and covering_jobs(batch[:1]) == batch[:1]


def test_every_multirun_of_the_app_uses_the_cell_sweeper_with_its_designs_params():
    cfg = composed(["experiment=[main,draws]"])
    assert cfg.hydra.sweeper._target_ == "hydra_plugins.k3_ablate.sweeper.CellSweeper"
    assert cfg.hydra.sweeper.params["ablation.draw"] == "range(-1,16)"
    assert "ablation.cell" in cfg.hydra.sweeper.params
    assert "hydra_plugins.k3_ablate.sweeper.CellSweeper" in Plugins.instance().class_name_to_class


class CountingLoader(ConfigLoaderImpl):
    def __init__(self):
        super().__init__(config_search_path=create_config_search_path(str(CONF_DIR)))
        self.composed: list[list[str]] = []

    def load_sweep_config(self, master_config, sweep_overrides):
        self.composed.append(list(sweep_overrides))
        return super().load_sweep_config(master_config, sweep_overrides)


def cell_sweeper(**kwargs):
    # the class as Hydra instantiates it: its plugin scan executes the modules again (BasicSweeper's included)
    return Plugins.instance().class_name_to_class["hydra_plugins.k3_ablate.sweeper.CellSweeper"](**kwargs)


def sweeper(loader):
    sweeper = cell_sweeper(max_batch_size=None)
    sweeper.config = composed(["experiment=[main,draws]"])
    sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=None)
    return sweeper


def test_a_batch_is_validated_by_composing_its_covering_jobs_only():
    loader = CountingLoader()
    batch = jobs(CELLS, range(-1, 3))
    sweeper(loader).validate_batch_is_legal(batch)
    assert loader.composed == covering_jobs(batch) and len(loader.composed) == 6      # of 12 jobs


def test_a_bad_value_in_a_late_job_fails_the_batch_before_it_runs():
    loader = CountingLoader()
    batch = [*jobs(CELLS, range(-1, 3)), ["ablation.cell=fusion", "ablation.draw=abc"]]
    with pytest.raises(ConfigCompositionException):
        sweeper(loader).validate_batch_is_legal(batch)
    assert loader.composed[-1] == batch[-1]


@pytest.mark.parametrize("arguments", [[], ["ablation.repeat=0,1"]], ids=["draws", "draws_and_repeats"])
def test_a_sweep_with_draws_runs_the_point_values_cells_first_then_each_draws_in_turn(arguments):
    cfg = composed(["experiment=[main,draws]"])
    params = {key: str(value) for key, value in cfg.hydra.sweeper.params.items()}
    sweeper = cell_sweeper(max_batch_size=None, params=params, outer=list(cfg.hydra.sweeper.outer))
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + arguments)
    [batch] = sweeper.split_arguments(overrides, None)
    keys = [dict(o.split("=", 1) for o in job) for job in batch]
    cells = len(params["ablation.cell"].split(","))
    assert cells == 64 and len(batch) == cells * 17 * (1 + len(arguments))
    draws = [int(job["ablation.draw"]) for job in keys]
    assert draws == sorted(draws) and draws[:cells] == [-1] * cells            # draw-major: whole draws in turn
    assert [job["ablation.cell"] for job in keys[:cells]] == params["ablation.cell"].split(",")
    if arguments:                                                              # then each repeat within a draw
        assert [job["ablation.repeat"] for job in keys[:2 * cells]] == ["0"] * cells + ["1"] * cells
