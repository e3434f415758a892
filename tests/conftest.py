"""Suite-wide pytest settings: fixed random state; the tiers, limits and process guard (tests/run_guard.py).

Tiers: `make check` runs `-m "not e2e and not spawns and not slow"` (no vLLM engine, no server, no second
process, nothing slow); `make test` runs everything.
"""

import random

import numpy as np
import pytest
import torch
from run_guard import pytest_addoption, pytest_collection_modifyitems, pytest_sessionfinish
from run_guard import pytest_configure as _guard_configure

__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "pytest_sessionfinish"]


@pytest.fixture(autouse=True)
def _fixed_seed() -> None:
    """Every test starts from the same random state, so a test that draws without its own generator is
    still repeatable."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def pytest_configure(config: pytest.Config) -> None:
    # pyproject's addopts carry --benchmark-disable so the normal run only smoke-tests the benchmarks;
    # an explicit --benchmark-only means "measure".
    if config.getoption("benchmark_only", default=False):
        config.option.benchmark_enable = True
    _guard_configure(config)
