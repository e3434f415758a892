"""Fixtures of the workload tests: generated presets and a JSONL writer for hand-made files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ablations.workload import Trace, generate, preset


@pytest.fixture(scope="session")
def agentx_trace() -> Trace:
    return generate(preset("agentx"), seed=0)


@pytest.fixture(scope="session")
def small_trace() -> Trace:
    return generate(preset("agentx_small"), seed=0)


@pytest.fixture
def write_rows(tmp_path):
    """Write dicts (or raw strings) as JSONL lines; returns the path."""

    def write(rows, name: str = "trace.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
        return path

    return write
