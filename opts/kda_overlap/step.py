"""On: one packed chunked pass over prefill segments and verification rows; streams: off's two parts on two
GPU streams at once."""

from __future__ import annotations

import torch

from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.naive import CHUNK_SIZE, prefill_part, prepare, verify_part
from opts.kda_overlap.packed import PackPlan, chunk_kda_packed


def step_on(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """One packed chunked pass over prefill segments and verification rows together, keeping every
    verification position's state. On a CUDA / ROCm device, the Triton kernel (`triton_packed.py`, its own
    chunk of 16); elsewhere PyTorch (`packed.py`), where verification rows need K+1 <= chunk_size."""
    if batch.q.device.type == "cuda":       # HIP devices are torch's "cuda" too
        from opts.kda_overlap.triton_packed import packed_step

        return packed_step(batch, out)
    out = prepare(batch, out)
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
    out = prepare(batch, out)
    main = torch.cuda.current_stream(batch.q.device)
    side = torch.cuda.Stream(device=batch.q.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        if batch.num_verify_tokens:
            verify_part(batch, out)
    if batch.num_prefill:
        prefill_part(batch, out, chunk_size)
    main.wait_stream(side)
    return out

