"""The mixed step, three ways: off (verification recurrent, then prefill chunked), on (one packed chunked
pass), streams (off's two parts on two GPU streams at once)."""

from __future__ import annotations

import torch

from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.packed import PackPlan, chunk_kda_packed
from opts.kda_overlap.recurrent import recurrent_kda_rows

CHUNK_SIZE = 64


def _prepare(batch: MixedStep, out: StepOutput | None) -> StepOutput:
    if out is None:
        return StepOutput.empty(batch)
    out.check_fits(batch)
    return out


def _verify_part(batch: MixedStep, out: StepOutput) -> None:
    p = batch.num_prefill_tokens
    sl = slice(p, p + batch.num_verify_tokens)
    recurrent_kda_rows(batch.q[sl], batch.k[sl], batch.v[sl], batch.g[sl], batch.beta[sl], batch.verify_lens,
                       batch.verify_state, scale=batch.resolved_scale, o_out=out.o[sl],
                       states_out=out.verify_states)


def _prefill_part(batch: MixedStep, out: StepOutput, chunk_size: int) -> None:
    sl = slice(0, batch.num_prefill_tokens)
    plan = PackPlan.build(batch.prefill_lens, chunk_size, device=batch.q.device)
    chunk_kda_packed(batch.q[sl], batch.k[sl], batch.v[sl], batch.g[sl], batch.beta[sl], plan,
                     [batch.prefill_state], scale=batch.resolved_scale, o_out=out.o[sl],
                     final_out=[out.prefill_final_state])


def step_off(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """vLLM today: all verification rows through the batched recurrent form, then the prefill segments
    through the chunked varlen form, one after the other."""
    out = _prepare(batch, out)
    if batch.num_verify_tokens:
        _verify_part(batch, out)
    if batch.num_prefill:
        _prefill_part(batch, out, chunk_size)
    return out


def step_on(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """One packed chunked pass over prefill segments and verification rows together, keeping every
    verification position's state. Verification rows need K+1 <= chunk_size."""
    out = _prepare(batch, out)
    keep = (False,) * batch.num_prefill + (True,) * batch.num_verify
    try:
        plan = PackPlan.build(batch.seq_lens, chunk_size, keep, device=batch.q.device)
    except ValueError as err:
        raise ValueError(f"MixedStep.verify_lens: {err} (verification rows are packed as single chunks)") from err
    chunk_kda_packed(batch.q, batch.k, batch.v, batch.g, batch.beta, plan,
                     [batch.prefill_state, batch.verify_state], scale=batch.resolved_scale, o_out=out.o,
                     final_out=[out.prefill_final_state, None], states_out=out.verify_states)
    return out


def step_streams(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """Off's two parts at once on a GPU: verification on a side stream while prefill runs on the current one."""
    if batch.q.device.type != "cuda":
        raise ValueError(f"KdaOverlapConfig.mode 'streams': needs a CUDA or ROCm device, the step is on "
                         f"{batch.q.device}; valid choices there: off, on")
    out = _prepare(batch, out)
    main = torch.cuda.current_stream(batch.q.device)
    side = torch.cuda.Stream(device=batch.q.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if batch.num_verify_tokens:
            _verify_part(batch, out)
    if batch.num_prefill:
        _prefill_part(batch, out, chunk_size)
    main.wait_stream(side)
    return out


STEPS = {"off": step_off, "on": step_on, "streams": step_streams}
