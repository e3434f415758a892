"""Suite-wide pytest settings."""

import random

import numpy as np
import pytest
import torch


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
