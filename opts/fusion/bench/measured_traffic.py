"""Measured traffic of one call: bytes read and written per op, kernels launched, memory allocated.

Three independent instruments, used by the tests to check the analytic counts in `traffic.py`:
- `count_ops` (a TorchDispatchMode): every top-level aten op reads its tensor inputs and writes its outputs
  (`index_put_`: its indices and values, and the rows it writes); it sees eager ops and allocations only (a
  compiled pass runs its kernel past the dispatcher, `dynamic.py`'s with the modes suspended);
- `profile_call` (torch.profiler): top-level data-moving aten ops and compiled kernels, and the bytes the
  allocator handed out (profile_memory), compiled passes' buffers included;
- `inductor_account`: inductor's own account of what its fused nodes read and write, and the intermediate
  buffers its generated wrapper allocates, per compiled body.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from opts.fusion.compiled import INDUCTOR_OPTIONS, trace

_ALLOC_OPS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}
_VIEW_OPS = {"_unsafe_view", "_reshape_alias", "lift_fresh"}
_WRITE_ONLY_INPLACE = {"copy_", "fill_", "zero_"}
# Profiler names of ops that move no data themselves (views, allocation, dtype no-ops).
_NO_DATA_EVENTS = {
    "aten::" + n for n in (
        "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "expand_as", "slice", "select", "narrow",
        "unsqueeze", "squeeze", "permute", "transpose", "t", "split", "split_with_sizes", "unbind", "chunk",
        "as_strided", "alias", "detach", "lift_fresh", "unflatten", "flatten", "view_as", "contiguous", "to",
        "type_as", "result_type", "resize_", "empty", "empty_strided", "empty_like", "new_empty",
        "new_empty_strided", "is_nonzero", "item", "_local_scalar_dense", "numpy_T")
}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches to stream `t` once: broadcast (stride-0) dims count once."""
    elements = math.prod(size for size, stride in zip(t.shape, t.stride(), strict=True) if stride != 0)
    return elements * t.element_size()


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype


@dataclass
class OpTraffic:
    name: str
    read: int
    written: int


@dataclass
class Traffic:
    """What one call's top-level aten ops read, wrote and allocated."""

    ops: list[OpTraffic] = field(default_factory=list)
    allocated: int = 0
    allocations: int = 0


class _Counter(TorchDispatchMode):
    def __init__(self, traffic: Traffic) -> None:
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        schema = func._schema
        name = func.overloadpacket.__name__
        outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        if name in _ALLOC_OPS:
            self._allocated(outputs)
            return result
        if name in _VIEW_OPS:
            return result
        mutates = [a.alias_info is not None and a.alias_info.is_write for a in schema.arguments]
        if any(r.alias_info is not None for r in schema.returns) and not any(mutates):
            return result                                   # a view: no data moves
        if name == "index_put_":                            # a scatter: reads indices and values, writes the rows
            values, indices = args[2], [t for t in args[1] if t is not None]
            read = sum(map(tensor_bytes, indices)) + tensor_bytes(values)
            self.traffic.ops.append(OpTraffic(name, read, tensor_bytes(values)))
            return result
        reads: dict[tuple, int] = {}
        writes: dict[tuple, int] = {}
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
            for t in tensors:
                if not mutates[i]:
                    reads[_key(t)] = tensor_bytes(t)
                    continue
                writes[_key(t)] = tensor_bytes(t)
                if not arg.is_out and name not in _WRITE_ONLY_INPLACE:
                    reads[_key(t)] = tensor_bytes(t)
        fresh = [t for t, r in zip(outputs, schema.returns, strict=False) if r.alias_info is None]
        for t in fresh:
            writes[_key(t)] = tensor_bytes(t)
        self._allocated(fresh)
        self.traffic.ops.append(OpTraffic(name, sum(reads.values()), sum(writes.values())))
        return result

    def _allocated(self, tensors: list[torch.Tensor]) -> None:
        self.traffic.allocations += len(tensors)
        self.traffic.allocated += sum(t.untyped_storage().nbytes() for t in tensors)


def count_ops(fn: Callable[[], Any]) -> Traffic:
    """Run `fn` once, counting each top-level aten op's bytes read and written (eager code only)."""
    traffic = Traffic()
    with _Counter(traffic):
        fn()
    return traffic


@dataclass(frozen=True)
class Profiled:
    """One call seen by torch.profiler: kernel names, and the allocator's allocations during it."""

    kernels: tuple[str, ...]
    allocations: int
    allocated: int


def _has_aten_ancestor(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


def _moves_data(event) -> bool:
    if event.name not in _NO_DATA_EVENTS:
        return True
    return any(_moves_data(c) for c in event.cpu_children if c.name.startswith("aten::"))


def profile_call(fn: Callable[[], Any], device: str = "cpu") -> Profiled:
    """Profile one call of `fn`. Kernels: on CPU, top-level data-moving aten ops plus inductor's compiled
    C++ kernels; on CUDA, the device kernels. Allocations: positive allocator events on `device`."""
    is_cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_cuda else [])
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
        if is_cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if is_cuda:
        kernels = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA
                   and e.name != "[memory]"]
        allocs = [e.device_memory_usage for e in events if e.name == "[memory]" and e.device_memory_usage > 0]
    else:
        kernels = [e.name for e in events
                   if ("cpp_fused" in e.name and not e.name.startswith("## "))
                   or (e.name.startswith("aten::") and not _has_aten_ancestor(e) and _moves_data(e))]
        allocs = [e.self_cpu_memory_usage for e in events if e.self_cpu_memory_usage > 0]
    return Profiled(tuple(kernels), len(allocs), sum(allocs))


_BUFFER = re.compile(r"^\s*(buf\d+) = empty_strided_(?:cpu|cuda)\(\(([\d, ]*)\), \([\d, ]*\), torch\.(\w+)\)",
                     re.MULTILINE)


@dataclass(frozen=True)
class InductorAccount:
    """What inductor generated for a body: its scheduler's count of bytes its fused nodes read and write,
    the number of nodes, and the intermediate buffers its wrapper allocates (bytes each)."""

    bytes: int
    nodes: int
    buffers: tuple[int, ...]

    @property
    def allocated(self) -> int:
        return sum(self.buffers)


def _buffers(code: str) -> tuple[int, ...]:
    sizes = []
    for _, shape, dtype in _BUFFER.findall(code):
        dims = [int(d) for d in shape.replace(" ", "").split(",") if d]
        sizes.append(math.prod(dims) * getattr(torch, dtype).itemsize)
    return tuple(sizes)


def inductor_account(body: Callable, *args: Any) -> InductorAccount:
    """Compile `body` for `args` afresh (no cache) with inductor's byte accounting on and its generated code
    captured; nothing is run."""
    from torch._inductor import compile_fx, metrics
    from torch._inductor.graph import GraphLowering

    gm, tensors = trace(body, args)
    code: list[str] = []
    metrics.reset()
    metrics_log = compile_fx.inductor_metrics_log
    level = metrics_log.level
    metrics_log.setLevel(logging.INFO)
    try:
        with mock.patch.object(GraphLowering, "save_output_code", code.append):
            torch._inductor.compile(gm, tensors, options={"fx_graph_cache": False, **INDUCTOR_OPTIONS})
    finally:
        metrics_log.setLevel(level)
    buffers = tuple(b for source in code for b in _buffers(source))
    return InductorAccount(metrics.num_bytes_accessed, len(metrics.nodes_num_elem), buffers)
