"""kda_overlap: KDA over a step that holds prefill chunks and speculative-verification rows, in one pass.

Off is `naive.step_off`, on is `step.step_on` over `packed.py`; the float64 references (flash-linear-attention
conventions) are in `reference.py`; the math is in README.md. In vLLM: `vllm.py` (the settings), `in_vllm/kernels.py`
(vLLM's kernel conventions over off and on; the CPU backend's KDA kernels run its off), `in_vllm/forward.py` (on's
wrappers of `KimiK3DeltaAttention._forward`).
"""

from __future__ import annotations

from opts.base import Optimization
from opts.kda_overlap import sim, vllm
from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.cases import bench_cases
from opts.kda_overlap.config import KdaOverlapConfig
from opts.kda_overlap.naive import step_off
from opts.kda_overlap.reference import chunk_kda, recurrent_kda, recurrent_kda_states, reference_step
from opts.kda_overlap.step import step_on, step_streams

__all__ = [
    "OPTIMIZATION",
    "KdaOverlapConfig",
    "MixedStep",
    "StepOutput",
    "chunk_kda",
    "recurrent_kda",
    "recurrent_kda_states",
    "reference_step",
    "step_off",
    "step_on",
    "step_streams",
]


OPTIMIZATION = Optimization(
    name="kda_overlap",
    description="KDA prefill chunks and speculative-verification rows in one packed chunked pass",
    config_cls=KdaOverlapConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
    removes_work=("streams",),  # the same passes, overlapped (on's packed pass computes the rows anew: more FLOPs)
)
