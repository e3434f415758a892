"""draft_length: how many MTP draft tokens a decoding step proposes; a fixed K (off) against the K per batch-size
bucket that maximizes expected accepted tokens per second (on), or no speculation (k0).

The acceptance model is `acceptance.py` (E(K), conditional and cumulative rates), the step cost `cost.py`, the
chooser `chooser.py` over vLLM's schedule form `schedule.py`; off is `naive.py`; the float64 references are
`reference.py`. The bench (`cases.py`, `bench/runner.py`) times a tiny K3-like stack (`bench/stack.py`, its MLA
`opts/k3/mla.py`) on the CPU (`bench/step_times.py`) and scores chosen against fixed K on held-out repeats
(`bench/evaluate.py`). In vLLM: `vllm.py`.
"""

from __future__ import annotations

from opts.base import Optimization
from opts.draft_length import sim, vllm
from opts.draft_length.acceptance import (
    alphas_from_counts,
    alphas_from_lengths,
    config_alphas,
    expected_tokens,
    expected_tokens_curve,
    profile_alphas,
    to_conditional,
    to_cumulative,
)
from opts.draft_length.bench.evaluate import Evaluation, Row, evaluate, table
from opts.draft_length.bench.runner import run_bench
from opts.draft_length.bench.stack import Stack, StackShape
from opts.draft_length.bench.step_times import Measurements, Sample, measure
from opts.draft_length.cases import GoodputCase, bench_cases
from opts.draft_length.chooser import choose_k, choose_schedule, goodput, policy
from opts.draft_length.config import DraftLengthConfig
from opts.draft_length.cost import StepCost, fit_step_cost
from opts.draft_length.naive import off_schedule
from opts.draft_length.reference import enumerated_expected_tokens, sample_accepted
from opts.draft_length.schedule import buckets, check_schedule, fixed_schedule, k_for_batch, merge_schedule

__all__ = [
    "OPTIMIZATION",
    "DraftLengthConfig",
    "Evaluation",
    "GoodputCase",
    "Measurements",
    "Row",
    "Sample",
    "Stack",
    "StackShape",
    "StepCost",
    "alphas_from_counts",
    "alphas_from_lengths",
    "bench_cases",
    "buckets",
    "check_schedule",
    "choose_k",
    "choose_schedule",
    "config_alphas",
    "enumerated_expected_tokens",
    "evaluate",
    "expected_tokens",
    "expected_tokens_curve",
    "fit_step_cost",
    "fixed_schedule",
    "goodput",
    "k_for_batch",
    "measure",
    "merge_schedule",
    "off_schedule",
    "policy",
    "profile_alphas",
    "run_bench",
    "sample_accepted",
    "table",
    "to_conditional",
    "to_cumulative",
]


OPTIMIZATION = Optimization(
    name="draft_length",
    description="MTP draft tokens per step: a fixed K against the goodput-maximizing K per batch-size bucket",
    config_cls=DraftLengthConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
    run_bench=run_bench,
    writes_files=True,
)
