"""moe_dedup: K3's latent-MoE tail across tensor-parallel ranks, the up-projection replicated (off) or sharded
(on), and sequence-parallel MoE (sp).

Off is `naive.tail_off`, on is `sharded.tail_on`, sp is `sequence.layer_sp` (its tail `sequence.tail_sp`); the
whole layer per rank is `layer.moe_layer` over `weights.py` and `experts.py`, its float64 reference
`reference.py`; the per-rank work `counts.py`. `bench/ranks.py` runs functions on real ranks (torch.distributed); the
bench (`cases.py`, `bench/rank_case.py`, `bench/runner.py`: `python -m opts bench moe_dedup`) times the modes on them.
In vLLM: `vllm.py`, `in_vllm.py`. The math and the measured numbers: README.md.
"""

from __future__ import annotations

from opts.base import Optimization
from opts.moe_dedup import sim, vllm
from opts.moe_dedup.bench.ranks import Comm, RankError, RankPool, run_ranks
from opts.moe_dedup.bench.runner import run_bench
from opts.moe_dedup.cases import DistCase, bench_cases
from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.counts import ModeCount, PartCount, mode_counts
from opts.moe_dedup.layer import moe_layer, rank_weights
from opts.moe_dedup.naive import tail_off
from opts.moe_dedup.reference import reference_layer, reference_tail
from opts.moe_dedup.sequence import layer_sp, tail_sp
from opts.moe_dedup.shape import K3_MOE, K3_MOE_BENCH, MoeShape, moe_shape
from opts.moe_dedup.sharded import tail_on
from opts.moe_dedup.weights import ExpertWeights, MlpWeights, MoeWeights, random_weights

__all__ = [
    "K3_MOE",
    "K3_MOE_BENCH",
    "OPTIMIZATION",
    "Comm",
    "DistCase",
    "ExpertWeights",
    "MlpWeights",
    "ModeCount",
    "MoeDedupConfig",
    "MoeShape",
    "MoeWeights",
    "PartCount",
    "RankError",
    "RankPool",
    "bench_cases",
    "layer_sp",
    "mode_counts",
    "moe_layer",
    "moe_shape",
    "random_weights",
    "rank_weights",
    "reference_layer",
    "reference_tail",
    "run_bench",
    "run_ranks",
    "tail_off",
    "tail_on",
    "tail_sp",
]


OPTIMIZATION = Optimization(
    name="moe_dedup",
    description="K3's latent-MoE tail: each tensor-parallel rank up-projects only its hidden shard (on) instead of "
                "the whole hidden size (off); sp: sequence-parallel MoE",
    config_cls=MoeDedupConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
    run_bench=run_bench,
)
