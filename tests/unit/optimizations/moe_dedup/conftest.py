"""Shared by moe_dedup's unit tests: one pool of two real gloo ranks (1 CPU thread each) for the whole run (the
tolerance against the float64 reference is in moe_dedup_helpers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from opts.moe_dedup.bench.ranks import RankPool

WORLD_SIZE = 2


@pytest.fixture(scope="session")
def pool() -> Iterator[RankPool]:
    with RankPool(WORLD_SIZE, backend="gloo", num_threads=1) as ranks:
        yield ranks

