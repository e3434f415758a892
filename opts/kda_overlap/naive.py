"""Off: the mixed step as stock vLLM runs it: every verification row through the batched recurrent form
(`recurrent.py`), then the prefill segments through the chunked varlen form, one after the other."""

from __future__ import annotations

from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.packed import PackPlan, chunk_kda_packed
from opts.kda_overlap.recurrent import recurrent_kda_rows

CHUNK_SIZE = 64


def prepare(batch: MixedStep, out: StepOutput | None) -> StepOutput:
    """`out` checked against the step, or a new StepOutput."""
    if out is None:
        return StepOutput.empty(batch)
    out.check_fits(batch)
    return out


def verify_part(batch: MixedStep, out: StepOutput) -> None:
    p = batch.num_prefill_tokens
    sl = slice(p, p + batch.num_verify_tokens)
    recurrent_kda_rows(batch.q[sl], batch.k[sl], batch.v[sl], batch.g[sl], batch.beta[sl], batch.verify_lens,
                       batch.verify_state, scale=batch.resolved_scale, o_out=out.o[sl],
                       states_out=out.verify_states)


def prefill_part(batch: MixedStep, out: StepOutput, chunk_size: int) -> None:
    sl = slice(0, batch.num_prefill_tokens)
    plan = PackPlan.build(batch.prefill_lens, chunk_size, device=batch.q.device)
    chunk_kda_packed(batch.q[sl], batch.k[sl], batch.v[sl], batch.g[sl], batch.beta[sl], plan,
                     [batch.prefill_state], scale=batch.resolved_scale, o_out=out.o[sl],
                     final_out=[out.prefill_final_state])


def step_off(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """vLLM today: all verification rows through the batched recurrent form, then the prefill segments
    through the chunked varlen form, one after the other."""
    out = prepare(batch, out)
    if batch.num_verify_tokens:
        verify_part(batch, out)
    if batch.num_prefill:
        prefill_part(batch, out, chunk_size)
    return out
