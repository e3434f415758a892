"""Suite-wide pytest settings: fixed random state; the tiers, limits and process guard (tests/run_guard.py).

Tiers: `make check` runs `-m "not e2e and not spawns and not slow"` (no vLLM engine, no server, no second
process but one: kda_overlap's Triton kernel checks, ~10 s in Triton's interpreter, which must start with the
process; nothing slow); `make test` runs everything.
"""

import json
import os
import random

import numpy as np
import pytest
import torch
from engine_groups import STARTS_FILE, group_of, run_rank, runs_ordered
from run_guard import pytest_addoption, pytest_sessionfinish
from run_guard import pytest_collection_modifyitems as _guard_collection
from run_guard import pytest_configure as _guard_configure

__all__ = ["pytest_addoption", "pytest_sessionfinish"]
ALL_CORES_ENV = "K3_TEST_ALL_CORES"   # the cores the run may use, before a worker keeps one (tensor-parallel engines)


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    """Every test starts from the same random state, so a test that draws without its own generator is
    still repeatable."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        # One core per worker, for the worker and everything it starts (engines, servers, children): the two
        # workers' engines never share a core, and one torch thread is what a core can run.
        cores = sorted(os.sched_getaffinity(0))
        os.environ.setdefault(ALL_CORES_ENV, ",".join(map(str, cores)))
        os.sched_setaffinity(0, {cores[int(worker.removeprefix("gw")) % len(cores)]})
        torch.set_num_threads(1)
    # pyproject's addopts carry --benchmark-disable so the normal run only smoke-tests the benchmarks;
    # an explicit --benchmark-only means "measure".
    if config.getoption("benchmark_only", default=False):
        config.option.benchmark_enable = True
    _guard_configure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The engine tests in tests/engine_groups.py's RUN_ORDER, in place among themselves; the guard's limits."""
    slots = [i for i, item in enumerate(items) if runs_ordered(item.nodeid)]
    ordered = sorted((items[i] for i in slots), key=lambda item: run_rank(item.nodeid))
    for slot, item in zip(slots, ordered, strict=True):
        items[slot] = item
    _guard_collection(config, items)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """How many vLLM engines the e2e pool started, per process (an xdist worker writes into its own basetemp)."""
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None or factory._basetemp is None:
        return
    root = factory.getbasetemp()
    for path in sorted([root / STARTS_FILE, *root.glob(f"popen-gw*/{STARTS_FILE}")]):
        if not path.is_file():
            continue
        starts = json.loads(path.read_text())
        where = path.parent.name if path.parent != root else "this process"
        names = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in starts)
        terminalreporter.write_line(f"e2e pool ({where}): {len(starts)} engine start(s): {names}")


def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (`make test`): the tests of one engine group (tests/engine_groups.py) form one unit of
    work for one worker, the largest units first; every other test is a unit of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class EngineGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return EngineGroupScheduling(config, log)
