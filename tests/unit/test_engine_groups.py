"""tests/engine_groups.py: the run order names real tests, and puts each group's engine uses together."""

from __future__ import annotations

import ast
from pathlib import Path

from engine_groups import ENGINE_BENCHMARK, RUN_ORDER, group_of, run_rank, runs_ordered

TESTS = Path(__file__).resolve().parents[1]
SYNTHETIC = "tests/e2e/test_vllm_spec.py::test_accepted_drafts_leave_the_right_kda_state"


def functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_every_entry_of_the_run_order_names_an_existing_module_or_test():
    for entry in RUN_ORDER:
        stem, _, test = entry.partition("::")
        path = TESTS.parent / ENGINE_BENCHMARK if stem == "engine" else TESTS / "e2e" / f"test_vllm_{stem}.py"
        assert path.is_file(), entry
        assert not test or test in functions(path), entry


def test_the_synthetic_acceptance_check_runs_before_every_other_base_engine_test():
    """Its one-shot reference starts `base` after `mtp_synthetic`: first, so `base` starts once."""
    others = [f"{ENGINE_BENCHMARK}::test_engine_start", "tests/e2e/test_vllm_generation.py::test_x",
              "tests/e2e/test_vllm_spec.py::test_mtp_matches_non_speculative"]
    assert all(run_rank(SYNTHETIC) < run_rank(other) for other in others)
    assert run_rank("tests/e2e/test_vllm_spec.py::test_mtp_random_sampling_runs") < run_rank(
        "tests/e2e/test_vllm_toggle_kda_overlap.py::test_on_generates_the_tokens_of_stock")
    assert run_rank("tests/e2e/test_vllm_serve_cell.py::test_x") == len(RUN_ORDER)
    assert runs_ordered(SYNTHETIC) and runs_ordered(f"{ENGINE_BENCHMARK}::test_engine_start")
    assert not runs_ordered("tests/unit/test_metrics.py::test_x")


def test_units_of_work():
    assert group_of(SYNTHETIC) == group_of(f"{ENGINE_BENCHMARK}::test_engine_start") == "vllm_base"
    assert group_of("tests/e2e/test_vllm_toggle_fusion.py::test_x[fusion_on]") == "vllm_toggles"
    assert group_of("tests/e2e/test_vllm_stock_cells.py::test_only[kda_overlap_on]") == "vllm_base"
    assert group_of("tests/unit/sim/test_sim_toggles.py::test_x") == "sim_toggles"
    assert group_of("tests/unit/sim/test_sim_engine.py::test_x") is None
