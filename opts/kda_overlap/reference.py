"""float64 truth: the KDA references (flash-linear-attention conventions, from opts.k3) and a mixed step
through them, one sequence at a time."""

from __future__ import annotations

from opts.k3 import chunk_kda, compute_dtype, recurrent_kda, recurrent_kda_states
from opts.kda_overlap.batch import MixedStep, StepOutput

__all__ = ["chunk_kda", "recurrent_kda", "recurrent_kda_states", "reference_step"]


def reference_step(batch: MixedStep) -> StepOutput:
    """A mixed step, one sequence at a time through the recurrent reference (the float64 ground truth)."""
    ct = compute_dtype(batch.q, batch.prefill_state, batch.verify_state)
    out = StepOutput.empty(batch, dtype=ct)
    bounds = batch.token_bounds
    for i in range(batch.num_prefill):
        sl = slice(bounds[i], bounds[i + 1])
        o, final = recurrent_kda(*batch.token_slices(sl), scale=batch.scale,
                                 initial_state=batch.prefill_state[i:i + 1], output_final_state=True)
        out.o[sl] = o[0]
        out.prefill_final_state[i] = final[0]
    vbounds = batch.verify_bounds
    for r in range(batch.num_verify):
        j = batch.num_prefill + r
        sl = slice(bounds[j], bounds[j + 1])
        if sl.stop == sl.start:
            continue
        o, states = recurrent_kda_states(*batch.token_slices(sl), scale=batch.scale,
                                         initial_state=batch.verify_state[r:r + 1])
        out.o[sl] = o[0]
        out.verify_states[vbounds[r]:vbounds[r + 1]] = states[0]
    return out
