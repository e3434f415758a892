"""On: one packed chunked pass over prefill segments and verification rows; streams: off's two parts on two
GPU streams at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from opts.kda_overlap.batch import MixedStep, StepOutput
from opts.kda_overlap.naive import CHUNK_SIZE, prefill_part, prepare, verify_part
from opts.kda_overlap.packed import PackPlan, chunk_kda_packed


def step_on(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None,
            checkpoints: Sequence[int] = (), checkpoints_out: torch.Tensor | None = None) -> StepOutput:
    """One packed chunked pass over prefill segments and verification rows together, keeping every
    verification position's state. On a CUDA / ROCm device, the Triton kernel (`triton_packed.py`, its own
    chunk of 16); elsewhere PyTorch (`packed.py`), where verification rows need K+1 <= chunk_size.
    `checkpoints[n]` > 0: prefill segment n's state after that many of its tokens goes to row n of
    `checkpoints_out` [num_prefill, H, dk, dv] (a multiple of the pass's chunk: ROCm's checkpoints are of 64)."""
    if len(checkpoints) > batch.num_prefill or (any(checkpoints) and (
            checkpoints_out is None or tuple(checkpoints_out.shape) != (batch.num_prefill, batch.num_heads,
                                                                       batch.dk, batch.dv))):
        raise ValueError(f"checkpoints: {len(checkpoints)} offsets for {batch.num_prefill} prefill segments need "
                         f"checkpoints_out of shape {(batch.num_prefill, batch.num_heads, batch.dk, batch.dv)}, "
                         f"got {None if checkpoints_out is None else tuple(checkpoints_out.shape)}")
    if batch.q.device.type == "cuda":       # HIP devices are torch's "cuda" too
        from opts.kda_overlap.triton_packed import packed_step

        return packed_step(batch, out, checkpoints, checkpoints_out)
    out = prepare(batch, out)
    keep = (False,) * batch.num_prefill + (True,) * batch.num_verify
    try:
        plan = PackPlan.build(batch.seq_lens, chunk_size, keep, device=batch.q.device, snapshots=checkpoints)
    except ValueError as err:
        if str(err).startswith("snapshots"):
            raise
        raise ValueError(f"MixedStep.verify_lens: {err} (verification rows are packed as single chunks)") from err
    chunk_kda_packed(batch.q, batch.k, batch.v, batch.g, batch.beta, plan,
                     [batch.prefill_state, batch.verify_state], scale=batch.resolved_scale, o_out=out.o,
                     final_out=[out.prefill_final_state, None], states_out=out.verify_states,
                     snapshots_out=checkpoints_out)
    return out


_side_streams: dict[torch.device, Any] = {}


def side_stream(device: torch.device) -> Any:
    """The side stream of `device` (one per device, made once)."""
    stream = _side_streams.get(device)
    if stream is None:
        streams = torch.get_device_module(device)
        # torch.cpu.Stream takes no device (its first argument is a priority); CUDA's and HIP's take it
        stream = _side_streams[device] = streams.Stream() if device.type == "cpu" else streams.Stream(device)
    return stream


def beside(side_work: Callable[[], Any], main_work: Callable[[], Any], device: torch.device) -> Any:
    """`side_work` on `device`'s side stream, which first waits for the current one (its inputs are written),
    while `main_work` runs on the current stream; the current stream then waits for the side one (the join).
    `main_work`'s result. On a CPU, whose streams run in order, the same calls run one after the other."""
    streams = torch.get_device_module(device)
    main, side = streams.current_stream(device), side_stream(device)
    side.wait_stream(main)
    with streams.stream(side):
        side_work()
    result = main_work()
    main.wait_stream(side)
    return result


def step_streams(batch: MixedStep, *, chunk_size: int = CHUNK_SIZE, out: StepOutput | None = None) -> StepOutput:
    """Off's two parts at once on a GPU: verification on a side stream while prefill runs on the current one."""
    if batch.q.device.type != "cuda":
        raise ValueError(f"KdaOverlapConfig.mode 'streams': needs a CUDA or ROCm device, the step is on "
                         f"{batch.q.device}; valid choices there: off, on")
    out = prepare(batch, out)
    beside(lambda: verify_part(batch, out) if batch.num_verify_tokens else None,
           lambda: prefill_part(batch, out, chunk_size) if batch.num_prefill else None, batch.q.device)
    return out

