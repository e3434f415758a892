"""Which worker runs which engine test under pytest-xdist: two groups of tests that share vLLM engines.

`make test` runs pytest with two workers (one per core). Tests of one group run on one worker, in RUN_ORDER,
so each engine starts once per group and its memoized results serve the whole group; each worker's engines
run on its own core (tests/e2e/vllm_pool.py `worker_core`). Every other test is its own unit of work, given
to whichever worker is free, except the modules of SHARED_MODULES: each is one unit, so the results its tests
memoize (the simulator's default-case points) are computed once. `group_of` works on node ids, so the
controller (which collects nothing) can schedule by it: see `pytest_xdist_make_scheduler` in tests/conftest.py.
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
# Modules whose tests share memoized results: module path -> unit name.
SHARED_MODULES = {"tests/unit/sim/test_sim_toggles.py": "sim_toggles"}
STARTS_FILE = "engine_starts.json"   # the engine starts an e2e pool writes when it closes (tests/e2e/conftest.py)
ENGINE_BENCHMARK = "tests/benchmarks/test_vllm_engine.py"   # the engine start and generation on `base`
E2E_DIR = "tests/e2e/"
# The order the engine tests run in, so that each engine starts once per process (the pool keeps one alive):
# e2e module stems ("engine" is ENGINE_BENCHMARK), "stem::test" for a test run apart from its module. The
# synthetic-acceptance check goes first: its one-shot reference then starts `base`, which the base tests keep
# using; the other MTP tests run before kda_overlap's, whose stock results they share.
RUN_ORDER = ("spec::test_accepted_drafts_leave_the_right_kda_state", "engine", "generation", "in_process",
             "server", "prefix_cache", "toggle_draft_length", "spec", "toggle_kda_overlap", "counters", "app",
             "cache_retention", "toggle_aiter_mla", "toggle_fusion", "toggle_moe_dedup", "stock_cells")


def _stem(path: str) -> str:
    return path.rpartition("/")[2].removesuffix(".py").removeprefix("test_vllm_")


def run_rank(nodeid: str) -> int:
    """Where a test of the e2e directory or the engine benchmark runs among them (RUN_ORDER; unlisted ones last)."""
    path, _, rest = nodeid.partition("::")
    stem, test = _stem(path), rest.partition("[")[0]
    for key in (f"{stem}::{test}", stem):
        if key in RUN_ORDER:
            return RUN_ORDER.index(key)
    return len(RUN_ORDER)


def runs_ordered(nodeid: str) -> bool:
    """Whether RUN_ORDER places this test: the e2e directory's and the engine benchmark's."""
    return nodeid.startswith(E2E_DIR) or nodeid.partition("::")[0] == ENGINE_BENCHMARK


def group_of(nodeid: str) -> str | None:
    """The unit of work of a test node id ("tests/e2e/test_vllm_spec.py::test_x"): its engine group or shared
    module, None for any other test."""
    path, _, rest = nodeid.partition("::")
    if path == ENGINE_BENCHMARK:
        return "vllm_base"
    if path in SHARED_MODULES:
        return SHARED_MODULES[path]
    if not path.startswith(E2E_DIR):
        return None
    stem = _stem(path)
    if stem == "stock_cells":
        param = rest.partition("[")[2].rstrip("]")
        return STOCK_CELL_GROUP.get(param)
    return next((group for group, modules in GROUPS.items() if stem in modules), None)
