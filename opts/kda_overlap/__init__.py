"""kda_overlap: KDA over a step that holds prefill chunks and speculative-verification rows, in one pass.

References (flash-linear-attention conventions) are in `opts.kda_overlap.naive`; the math is in README.md.
"""

from __future__ import annotations

from opts.base import Optimization
from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.cases import bench_cases
from opts.kda_overlap.config import KdaOverlapConfig
from opts.kda_overlap.naive import chunk_kda, recurrent_kda, recurrent_kda_states, reference_step
from opts.kda_overlap.step import STEPS, step_off, step_on, step_streams

__all__ = [
    "OPTIMIZATION",
    "KdaOverlapConfig",
    "MixedStep",
    "StepOutput",
    "chunk_kda",
    "recurrent_kda",
    "recurrent_kda_states",
    "reference_step",
    "run_step",
    "step_off",
    "step_on",
    "step_streams",
]


def run_step(config: KdaOverlapConfig, batch: MixedStep, out: StepOutput | None = None) -> StepOutput:
    """The step as `config.mode` runs it."""
    return STEPS[config.mode](batch, chunk_size=config.chunk_size, out=out)


OPTIMIZATION = Optimization(
    name="kda_overlap",
    description="KDA prefill chunks and speculative-verification rows in one packed chunked pass",
    config_cls=KdaOverlapConfig,
    bench_cases=bench_cases,
)
