"""Fixtures for the vLLM-CPU e2e tests: one engine pool for the session, counters collected across processes."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from ablations.backends.vllm.counters import COUNTER_DIR_ENV


@pytest.fixture(scope="session")
def counter_dir(tmp_path_factory):
    """Where every vLLM process of this session writes its replaced-kernel counts."""
    path = tmp_path_factory.mktemp("k3_counters")
    previous = os.environ.get(COUNTER_DIR_ENV)
    os.environ[COUNTER_DIR_ENV] = str(path)
    yield path
    if previous is None:
        os.environ.pop(COUNTER_DIR_ENV, None)
    else:
        os.environ[COUNTER_DIR_ENV] = previous


@pytest.fixture(scope="session")
def pool(counter_dir):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install -e '.[vllm]' or scripts/bootstrap.sh)")
    from vllm_pool import EnginePool

    from ablations.backends.vllm.runtime import hide_media_wheels

    hide_media_wheels()

    engines = EnginePool()
    yield engines
    engines.close()


# Modules in an order that restarts engines least (the pool keeps one engine alive).
MODULE_ORDER = ("generation", "prefix_cache", "spec", "in_process", "server", "counters")


def pytest_collection_modifyitems(config, items):
    """Reorder only this directory's items, in place among themselves."""
    here = Path(__file__).parent

    def rank(item) -> int:
        stem = item.path.stem.removeprefix("test_vllm_")
        return MODULE_ORDER.index(stem) if stem in MODULE_ORDER else len(MODULE_ORDER)

    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    for slot, item in zip(slots, sorted((items[i] for i in slots), key=rank), strict=True):
        items[slot] = item
