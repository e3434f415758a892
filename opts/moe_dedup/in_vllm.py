"""The latent-MoE tail inside vLLM's K3 runners, as this package's off and on (wrappers of the runners' tiers).

vLLM's runners call `tail(self, fused_output, shared_output, trunc_size)`: `fused_output` is this rank's partial
routed output in the latent, `shared_output` its partial shared-expert output (hidden wide). The replacements run
`naive.tail_off` (replicated) or `sharded.tail_on` (this rank's hidden shard) with vLLM's tensor-parallel
all-reduce, the runner's latent norm and up-projection weight, then vLLM's own padding strip.

Where vLLM holds only this rank's rows of the up-projection (ROCm's `ColumnParallelLinear`, `row_sharded`), the
replicated tail needs the whole weight: the first call all-gathers it once and keeps it on the runner (every rank
calls the tail in the same step, so the gather is collective-safe; it is part of setting off up, not of a step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opts.moe_dedup import naive, sharded

FULL_WEIGHT_ATTR = "_k3_ablate_full_up_weight"


def full_up_weight(runner: Any) -> Any:
    """The whole up-projection weight [H, L]: vLLM's own where it is replicated, else (rows sharded per rank) the
    ranks' rows all-gathered once and cached on the runner."""
    transform = runner.routed_output_transform
    if not getattr(transform, "row_sharded", False):
        return transform.up_proj.weight
    if getattr(runner, FULL_WEIGHT_ATTR, None) is None:
        from vllm.distributed import tensor_model_parallel_all_gather

        setattr(runner, FULL_WEIGHT_ATTR, tensor_model_parallel_all_gather(transform.up_proj.weight.contiguous(), 0))
    return getattr(runner, FULL_WEIGHT_ATTR)


def _parts(runner: Any) -> tuple[Any, Any, Callable[[Any], Any]]:
    from vllm.distributed import tensor_model_parallel_all_reduce

    transform = runner.routed_output_transform
    norm = transform.norm if transform.norm is not None else (lambda x: x)
    return norm, full_up_weight(runner), tensor_model_parallel_all_reduce


def replicated_tail(runner: Any, fused_output: Any, shared_output: Any, trunc_size: int | None) -> Any:
    """off in vLLM: the latent all-reduced, normed and up-projected to the full hidden size on every rank, plus
    the separately all-reduced shared output (`naive.tail_off`)."""
    norm, weight, all_reduce = _parts(runner)
    out = naive.tail_off(fused_output, shared_output, norm=norm, up_weight=weight, all_reduce=all_reduce)
    return runner._maybe_reduce_final_output(out, trunc_size, output_is_reduced=True)


def sharded_tail(runner: Any, fused_output: Any, shared_output: Any, trunc_size: int | None) -> Any:
    """on in vLLM: this rank up-projects only its hidden shard into its shared partial, then one all-reduce
    (`sharded.tail_on`)."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    norm, weight, all_reduce = _parts(runner)
    out = sharded.tail_on(fused_output, shared_output, norm=norm, up_weight=weight, all_reduce=all_reduce,
                          rank=get_tensor_model_parallel_rank(), world_size=get_tensor_model_parallel_world_size())
    return runner._maybe_reduce_final_output(out, trunc_size, output_is_reduced=True)


def always(tail: Callable[..., Any]) -> Callable[[Any], Any]:
    """A `wrap` replacing a runner's tier method by `tail`, whatever it held."""

    def wrap(_base: Any) -> Any:
        def method(self: Any, fused_output: Any, shared_output: Any, trunc_size: int | None) -> Any:
            return tail(self, fused_output, shared_output, trunc_size)

        return method

    return wrap


def by_tokens(threshold: int, small: Callable[..., Any]) -> Callable[[Any], Any]:
    """A `wrap` that runs `small` for steps of at most `threshold` tokens and the wrapped method above (vLLM's
    NVIDIA tier choice, for a runner that has only the sharded tier)."""

    def wrap(base: Any) -> Any:
        def method(self: Any, fused_output: Any, shared_output: Any, trunc_size: int | None) -> Any:
            if fused_output.shape[0] <= threshold:
                return small(self, fused_output, shared_output, trunc_size)
            return base(self, fused_output, shared_output, trunc_size)

        return method

    return wrap
