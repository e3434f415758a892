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
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from opts.kda_overlap.in_vllm.kernels import Prefill, Verify, finish_prefill, mixed_on
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
    fuse_gate: Any = None


def current_call() -> MixedCall | None:
    """The mixed step this thread's `_forward` is in, or None."""
    return getattr(_local, "call", None)


def is_mixed_step(layer: Any) -> bool:
    """Whether `layer`'s metadata this step holds prefill rows and speculative rows (as `observe_mixed_steps`
    counts them) and the layer takes the path the packed pass replaces (Triton-style prefill kernel, no
    RecoverSSM)."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    m = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    return (m is not None and m.num_spec_decodes > 0 and m.num_prefills > 0
            and layer.kda_prefill_backend == "triton" and not layer.use_recoverssm)


def overlap_forward(base: Callable[..., Any], chunk_size: int) -> Callable[..., Any]:
    """Wrap `_forward`: a mixed step runs with a `MixedCall` current, which the packed pass must consume."""

    def _forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_mixed_step(self):
            return base(self, *args, **kwargs)
        call = MixedCall(chunk_size)
        _local.call = call
        try:
            result = base(self, *args, **kwargs)
        finally:
            _local.call = None
        if call.verify is not None and not call.done:
            raise RuntimeError(f"kda_overlap: layer {self.prefix!r} deferred its verification rows but never "
                               "called chunk_kda_with_fused_gate in this step; the verification output is unfilled")
        return result

    _forward.__wrapped__ = base  # type: ignore[attr-defined]
    return _forward


def defer_verify(base: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap `fused_recurrent_kda`: in a mixed step, record the call and return (`out` unfilled, the cache)."""

    def fused_recurrent_kda(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state, cu_seqlens,
                            ssm_state_indices, num_accepted_tokens=None, out=None, fuse_gate=None):
        args = dict(q=q, k=k, v=v, raw_g=raw_g, raw_beta=raw_beta, A_log=A_log, dt_bias=dt_bias,
                    lower_bound=lower_bound, initial_state=initial_state, cu_seqlens=cu_seqlens,
                    ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens)
        call = current_call()
        if call is None or call.verify is not None:
            return base(**args, out=out, fuse_gate=fuse_gate)
        call.verify = args
        call.out = torch.empty_like(v) if out is None else out
        call.verify_kernel, call.fuse_gate = base, fuse_gate
        return call.out, initial_state

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


def streamed_step(call: MixedCall, prefill_kernel: Callable[..., Any], args: dict[str, Any]) -> Any:
    """One mixed step on two streams: the deferred verification (`call`, vLLM's own kernel) on the side stream,
    the prefill (`prefill_kernel(**args)`) on the current one, joined before return. Fills the verification
    output `call.out` (and its state slots, as the kernel does); returns what the prefill kernel returns.
    Every tensor the side stream reads or writes is held by `call` or the caller until the join, so the caching
    allocator reuses none of them early."""
    if call.verify is None or call.out is None or call.verify_kernel is None:
        raise ValueError("streamed_step: the mixed step holds no deferred verification call")

    def verify() -> None:
        o, _ = call.verify_kernel(**call.verify, out=call.out, fuse_gate=call.fuse_gate)
        if o.data_ptr() != call.out.data_ptr():      # a kernel that ignores `out`
            call.out.copy_(o)

    return beside(verify, lambda: prefill_kernel(**args), call.out.device)
