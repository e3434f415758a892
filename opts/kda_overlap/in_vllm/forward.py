"""kda_overlap=on inside vLLM's `KimiK3DeltaAttention._forward` (vllm/models/kimi_k3/nvidia/kda.py:904-1372).

In a step holding prefill rows and speculative rows, `_forward` calls `fused_recurrent_kda` on the
verification rows (:1136) and then `chunk_kda_with_fused_gate` on the prefill rows (:1300), both imported
from the ops module at each call (:917-921). Between the two nothing reads the verification output or the
verification rows' state slots: the prefill path only convolves its own rows, gathers its own slots'
states and calls the prefill kernel; the verification output is read after both (:1351-1358).

`overlap_forward` marks such a step; in it `defer_verify` records the verification call and returns its
`out` unfilled; `packed_prefill` then runs `packed_step`: one packed chunked pass over both calls
(`kernels.mixed_on`), which fills the verification output, writes every verification position's
state into its slot and returns the prefill output and final states as the prefill kernel would. Any other
step runs the wrapped functions unchanged. vLLM is imported only inside the functions.

kda_overlap=streams marks and defers the same way; `streamed_prefill` then runs `streamed_step`: the deferred
verification call, with vLLM's own `fused_recurrent_kda`, on a side stream that first waits for the current
one (its inputs are ready), the prefill call with vLLM's own kernel on the current stream meanwhile, and the
current stream waits for the side one before anything reads the verification output (the join). The same
kernels in the same order as off: only the stream calls (`torch.get_device_module`'s `Stream`,
`wait_stream`, `stream`) differ, and on a CPU they run in order, so the split and join are tested there.

ROCm runs `vllm/models/kimi_k3/amd/kda.py` (`_forward` :352-706): the verification call `fused_recurrent_kda`
(:496, with `uniform_sequence_length`; in a step that also prefills it returns a new tensor) and then its own
prefill kernel `chunk_kda_prefill` (:620), which reads and writes the paged state cache itself (`state_cache`,
`state_indices`, `has_initial_state`) and writes the prefix cache's mid-prefill state checkpoints. Between the
two only the prefill rows' convolutions and the checkpoint's conv half run (the decode peel of :566 is skipped
in a step with speculative rows); the verification output is read at the merge (:696). `defer_verify_rocm` and
`streamed_prefill_rocm` are the same wrappers in that file's signatures; every step runs the prefill kernel
(either backend, fused or Triton), so a mixed step is marked by its metadata alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from opts.kda_overlap.in_vllm.kernels import (
    Prefill,
    Verify,
    checkpoint_lengths,
    checkpoint_rows,
    finish_prefill,
    finish_rocm_prefill,
    mixed_on,
    rocm_prefill,
    write_checkpoints,
)
from opts.kda_overlap.step import beside

_local = threading.local()


@dataclass
class MixedCall:
    """One mixed layer step: the deferred verification call's arguments, once made, and whether the packed
    pass consumed them."""

    chunk_size: int
    verify: dict[str, Any] | None = None
    out: torch.Tensor | None = field(default=None, repr=False)
    done: bool = False
    verify_kernel: Callable[..., Any] | None = field(default=None, repr=False)    # what defer_verify wraps
    verify_options: dict[str, Any] = field(default_factory=dict)    # its arguments besides the rows and out


def current_call() -> MixedCall | None:
    """The mixed step this thread's `_forward` is in, or None."""
    return getattr(_local, "call", None)


def is_mixed_step(layer: Any, rocm: bool = False) -> bool:
    """Whether `layer`'s metadata this step holds prefill rows and speculative rows (as `observe_mixed_steps`
    counts them) and the layer takes the path the wrappers replace: on ROCm always (`chunk_kda_prefill`), else
    the Triton-style prefill kernel without RecoverSSM."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    m = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if m is None or not (m.num_spec_decodes > 0 and m.num_prefills > 0):
        return False
    return rocm or (layer.kda_prefill_backend == "triton" and not layer.use_recoverssm)


def overlap_forward(base: Callable[..., Any], chunk_size: int, rocm: bool = False) -> Callable[..., Any]:
    """Wrap `_forward` (`rocm`: amd/kda.py's): a mixed step runs with a `MixedCall` current, which the packed
    pass or the two-stream step must consume."""

    def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_mixed_step(self, rocm):
            return base(self, *args, **kwargs)
        call = MixedCall(chunk_size)
        _local.call = call
        try:
            result = base(self, *args, **kwargs)
        finally:
            _local.call = None
        if call.verify is not None and not call.done:
            raise RuntimeError(f"kda_overlap: layer {self.prefix!r} deferred its verification rows but never "
                               f"called {'chunk_kda_prefill' if rocm else 'chunk_kda_with_fused_gate'} in this "
                               "step; the verification output is unfilled")
        return result

    _forward.__wrapped__ = base  # type: ignore[attr-defined]
    return _forward


def _defer(base: Callable[..., Any], args: dict[str, Any], out: torch.Tensor | None,
           options: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """In a mixed step, record the first verification call (`args`: its rows, states and slots; `options`: the
    rest) and return its `out` unfilled and the cache; any other call runs `base`."""
    call = current_call()
    if call is None or call.verify is not None:
        return base(**args, out=out, **options)
    call.verify = args
    call.out = torch.empty_like(args["v"]) if out is None else out
    call.verify_kernel, call.verify_options = base, options
    return call.out, args["initial_state"]


def defer_verify(base: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `fused_recurrent_kda` (nvidia/kda.py's): in a mixed step, record the call and return (`out`
    unfilled, the cache)."""

    def fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                            ssm_state_indices, num_accepted_tokens=None, out=None, fuse_gate=None):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, dt_bias=dt_bias,
                    lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens)
        return _defer(base, args, out, {"fuse_gate": fuse_gate})

    fused_recurrent_kda.__wrapped__ = base  # type: ignore[attr-defined]
    return fused_recurrent_kda


def defer_verify_rocm(base: Callable[..., Any]) -> Callable[..., Any]:
    """`defer_verify` for amd/kda.py's `fused_recurrent_kda` (its `uniform_sequence_length`, a launch hint)."""

    def fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                            ssm_state_indices, num_accepted_tokens=None, uniform_sequence_length=None, out=None,
                            fuse_gate=None):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, dt_bias=dt_bias,
                    lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens)
        return _defer(base, args, out, {"uniform_sequence_length": uniform_sequence_length, "fuse_gate": fuse_gate})

    fused_recurrent_kda.__wrapped__ = base  # type: ignore[attr-defined]
    return fused_recurrent_kda


def packed_prefill(base: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `chunk_kda_with_fused_gate`: after a deferred verification call, run `packed_step` instead."""

    def chunk_kda_with_fused_gate(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=None, initial_state=None,
                                  output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False,
                                  cu_seqlens=None, out=None, **kwargs):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state, lower_bound=lower_bound,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, out=out)
        call = current_call()
        if call is None or call.verify is None or call.done:
            return base(**args, **kwargs)
        # looked up in this module at call time: the toggle's patch replaces it with a counted version
        result = packed_step(call, **args)
        call.done = True
        return result

    chunk_kda_with_fused_gate.__wrapped__ = base  # type: ignore[attr-defined]
    return chunk_kda_with_fused_gate


def packed_step(call: MixedCall, *, q, k, v, raw_g, raw_beta, A_log, g_bias, scale=None, initial_state=None,
                output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                out=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The packed pass of one mixed step: the deferred verification call and this prefill call (vLLM's
    `chunk_kda_with_fused_gate` arguments) through `mixed_on`. Fills the verification output and state slots;
    returns what the prefill kernel returns."""
    if call.verify is None or call.out is None:
        raise ValueError("packed_step: the mixed step holds no deferred verification call")
    prefill = Prefill.from_vllm(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                                lower_bound=lower_bound, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                cu_seqlens=cu_seqlens)
    verify = Verify.from_vllm(**call.verify)
    o_prefill, finals, o_verify, states = mixed_on(prefill, verify, call.chunk_size)
    verify.finish(o_verify, states, call.out, call.verify["initial_state"])
    return finish_prefill(o_prefill, finals, v, out, output_final_state)


def streamed_prefill(base: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `chunk_kda_with_fused_gate` (kda_overlap=streams): after a deferred verification call, run
    `streamed_step`, the verification on a side stream beside this prefill call."""

    def chunk_kda_with_fused_gate(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=None, initial_state=None,
                                  output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False,
                                  cu_seqlens=None, out=None, **kwargs):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state, lower_bound=lower_bound,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens, out=out, **kwargs)
        call = current_call()
        if call is None or call.verify is None or call.done:
            return base(**args)
        # looked up in this module at call time: the toggle's patch replaces it with a counted version
        result = streamed_step(call, base, args)
        call.done = True
        return result

    chunk_kda_with_fused_gate.__wrapped__ = base  # type: ignore[attr-defined]
    return chunk_kda_with_fused_gate


def _rocm_prefill(base: Callable[..., Any], run: Callable[[MixedCall, dict[str, Any]], Any]) -> Callable[..., Any]:
    """Wrap amd/kda.py's `chunk_kda_prefill` (its signature): after a deferred verification call, `run(call,
    arguments)` instead; any other call runs `base`."""

    def chunk_kda_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias=None, scale=None, initial_state=None,
                          output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                          chunk_indices=None, chunk_offsets=None, use_fused_chunk=False, out=None,
                          checkpoint_state=None, checkpoint_offsets=None, checkpoint_state_indices=None,
                          state_cache=None, state_indices=None, has_initial_state=None):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, g_bias=g_bias, scale=scale,
                    initial_state=initial_state, output_final_state=output_final_state, lower_bound=lower_bound,
                    use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                    chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, use_fused_chunk=use_fused_chunk,
                    out=out, checkpoint_state=checkpoint_state, checkpoint_offsets=checkpoint_offsets,
                    checkpoint_state_indices=checkpoint_state_indices, state_cache=state_cache,
                    state_indices=state_indices, has_initial_state=has_initial_state)
        call = current_call()
        if call is None or call.verify is None or call.done:
            return base(**args)
        result = run(call, args)
        call.done = True
        return result

    chunk_kda_prefill.__wrapped__ = base  # type: ignore[attr-defined]
    return chunk_kda_prefill


def packed_prefill_rocm(base: Callable[..., Any]) -> Callable[..., Any]:
    """`packed_prefill` for amd/kda.py's `chunk_kda_prefill`: after a deferred verification call, run
    `packed_step_rocm` instead (looked up in this module at call time: the toggle's patch replaces it with a
    counted version)."""
    return _rocm_prefill(base, lambda call, args: packed_step_rocm(call, **args))


def packed_step_rocm(call: MixedCall, *, q, k, v, raw_g, raw_beta, A_log, g_bias=None, scale=None,
                     initial_state=None, output_final_state=False, lower_bound=None, use_qk_l2norm_in_kernel=False,
                     cu_seqlens=None, chunk_indices=None, chunk_offsets=None, use_fused_chunk=False, out=None,
                     checkpoint_state=None, checkpoint_offsets=None, checkpoint_state_indices=None,
                     state_cache=None, state_indices=None, has_initial_state=None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`packed_step` for amd/kda.py's prefill kernel: the starting states read from the paged cache (zeros where
    a sequence has none), one packed pass over both calls, the final states written back to their rows and
    each checkpoint's state (from the same pass) to its row; returns what `chunk_kda_prefill` returns. The
    chunk-index metadata and the backend choice are the stock kernel's and unused here."""
    if call.verify is None or call.out is None:
        raise ValueError("packed_step_rocm: the mixed step holds no deferred verification call")
    prefill = rocm_prefill(q, k, v, raw_g, raw_beta, A_log, g_bias, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, lower_bound=lower_bound,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                           state_cache=state_cache, state_indices=state_indices, has_initial_state=has_initial_state)
    verify = Verify.from_vllm(**call.verify)
    checkpoints = checkpoint_rows(checkpoint_offsets, checkpoint_state_indices, prefill.seq_lens)
    at = torch.empty_like(prefill.initial_state) if checkpoints else None
    offsets = checkpoint_lengths(checkpoints, len(prefill.seq_lens)) if checkpoints else ()
    o_prefill, finals, o_verify, states = mixed_on(prefill, verify, call.chunk_size, offsets, at)
    verify.finish(o_verify, states, call.out, call.verify["initial_state"])
    if checkpoints:
        write_checkpoints(checkpoint_state, checkpoints, at)
    return finish_rocm_prefill(o_prefill, finals, v, out, output_final_state, state_cache, state_indices)


def streamed_prefill_rocm(base: Callable[..., Any]) -> Callable[..., Any]:
    """`streamed_prefill` for amd/kda.py's `chunk_kda_prefill` (the paged state cache and the checkpoints are
    its own arguments, handed through)."""
    return _rocm_prefill(base, lambda call, args: streamed_step(call, base, args))


def streamed_step(call: MixedCall, prefill_kernel: Callable[..., Any], args: dict[str, Any]) -> Any:
    """One mixed step on two streams: the deferred verification (`call`, vLLM's own kernel) on the side stream,
    the prefill (`prefill_kernel(**args)`) on the current one, joined before return. Fills the verification
    output `call.out` (and its state slots, as the kernel does); returns what the prefill kernel returns.
    Every tensor the side stream reads or writes is held by `call` or the caller until the join, so the caching
    allocator reuses none of them early. The verification's state slots are not the prefill's rows nor its
    checkpoints' (vLLM's allocator gives each request its own), so the two streams write apart."""
    if call.verify is None or call.out is None or call.verify_kernel is None:
        raise ValueError("streamed_step: the mixed step holds no deferred verification call")

    def verify() -> None:
        o, _ = call.verify_kernel(**call.verify, out=call.out, **call.verify_options)
        if o.data_ptr() != call.out.data_ptr():      # a kernel that ignores `out`
            call.out.copy_(o)

    return beside(verify, lambda: prefill_kernel(**args), call.out.device)
