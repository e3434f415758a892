"""Suite-wide pytest settings."""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # pyproject's addopts carry --benchmark-disable so the normal run only smoke-tests the benchmarks;
    # an explicit --benchmark-only means "measure".
    if config.getoption("benchmark_only", default=False):
        config.option.benchmark_enable = True
