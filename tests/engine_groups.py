"""Which worker runs which engine test under pytest-xdist: two groups of tests that share vLLM engines.

`make test` runs pytest with two workers (one per core). Tests of one group run on one worker, in collection
order, so each engine starts once per group and its memoized results serve the whole group; each worker's
engines run on its own core (tests/e2e/vllm_pool.py `worker_core`). Every other test is its own unit of work,
given to whichever worker is free. `group_of` works on node ids, so the controller (which collects nothing)
can schedule by it: see `pytest_xdist_make_scheduler` in tests/conftest.py.
"""

from __future__ import annotations

# The stock engine `base` and its MTP and draft-length relatives; the prefix-cache stock engine's toggles,
# tensor parallelism, and the tests that start their own engine processes.
GROUPS = {
    "vllm_base": ("generation", "in_process", "server", "prefix_cache", "toggle_draft_length", "toggle_kda_overlap",
                  "spec", "counters"),
    "vllm_toggles": ("app", "cache_retention", "toggle_aiter_mla", "toggle_fusion", "toggle_moe_dedup"),
}
# stock_cells items go with the toggled engine they read (their id parameter).
STOCK_CELL_GROUP = {"draft_length_on": "vllm_base", "draft_length_off": "vllm_base", "kda_overlap_on": "vllm_base",
                    "aiter_mla_off": "vllm_toggles", "fusion_off": "vllm_toggles", "fusion_on": "vllm_toggles",
                    "moe_dedup_off": "vllm_toggles"}
ENGINE_BENCHMARK = "tests/benchmarks/test_vllm_engine.py"   # the engine start and generation on `base`
E2E_DIR = "tests/e2e/"


def group_of(nodeid: str) -> str | None:
    """The engine group of a test node id ("tests/e2e/test_vllm_spec.py::test_x"), None for any other test."""
    path, _, rest = nodeid.partition("::")
    if path == ENGINE_BENCHMARK:
        return "vllm_base"
    if not path.startswith(E2E_DIR):
        return None
    stem = path.removeprefix(E2E_DIR).removesuffix(".py").removeprefix("test_vllm_")
    if stem == "stock_cells":
        param = rest.partition("[")[2].rstrip("]")
        return STOCK_CELL_GROUP.get(param)
    return next((group for group, modules in GROUPS.items() if stem in modules), None)
