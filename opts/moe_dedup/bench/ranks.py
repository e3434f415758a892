"""Real ranks for the layer: N processes joined by torch.distributed (gloo on CPU, nccl with one GPU per rank).

`RankPool(n)` starts the processes once; `pool.run(fn, *args)` calls `fn(comm, *args)` on every rank and returns
the per-rank results; an exception on a rank is raised here as `RankError` with that rank's number and traceback.
`fn` must be importable by name (a module-level function), its arguments and results picklable.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

POLL_S = 0.2
ERROR_GRACE_S = 5.0
PARENT_CHECK_S = 2.0
START_TIMEOUT_S = 300.0
# A call no rank answers within this is a hang: the pool is closed and the call raises RankError.
RUN_TIMEOUT_S = 600.0
# torch >= 2.13 names them *_single; earlier ones *_tensor.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class RankError(RuntimeError):
    """A rank's exception, or a rank that died, seen from the parent."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(world_size: int) -> str:
    """nccl when CUDA shows a GPU per rank, else gloo."""
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world_size
    return "nccl" if cuda and dist.is_nccl_available() else "gloo"


@dataclass
class Comm:
    """One rank's view: its number, the world size, its device, and the collectives the layer uses. Each
    collective returns its result (all_reduce sums in place). `log` records (op, payload bytes) per call; with
    `poison` the buffers a collective fills are NaN first, so an element it leaves unwritten shows."""

    rank: int
    world_size: int
    device: str
    backend: str
    poison: bool = False
    log: list[tuple[str, int]] = field(default_factory=list)
    native_reduce_scatter: bool = True

    def _new(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        out = torch.empty(shape, dtype=like.dtype, device=like.device)
        return out.fill_(float("nan")) if self.poison and like.is_floating_point() else out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place; returns x."""
        self.log.append(("all_reduce", x.numel() * x.element_size()))
        dist.all_reduce(x)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x [n, ...] stacked in rank order: [world_size * n, ...]."""
        x = x.contiguous()
        out = self._new((self.world_size * x.shape[0], *x.shape[1:]), x)
        self.log.append(("all_gather", out.numel() * out.element_size()))
        _ALL_GATHER(out, x)
        return out

    def reduce_scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Rows [r n, (r+1) n) of the sum over the ranks of x [world_size * n, ...], on rank r. Where the backend
        has no reduce-scatter: an all-reduce and this rank's slice (twice the traffic; the log still names
        reduce_scatter and its payload)."""
        x = x.contiguous()
        n = x.shape[0] // self.world_size
        self.log.append(("reduce_scatter", x.numel() * x.element_size()))
        if self.native_reduce_scatter:
            out = self._new((n, *x.shape[1:]), x)
            try:
                _REDUCE_SCATTER(out, x)
                return out
            except RuntimeError as err:
                if "not supported" not in str(err).lower() and "unimplemented" not in str(err).lower():
                    raise
                self.native_reduce_scatter = False
        dist.all_reduce(x)
        return x[self.rank * n:(self.rank + 1) * n]

    def barrier(self) -> None:
        """Wait for every rank (on a GPU, its queued work too)."""
        self.synchronize()
        dist.barrier()

    def synchronize(self) -> None:
        """Wait for this rank's device work."""
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)


def _worker(rank: int, world_size: int, port: int, backend: str, num_threads: int | None,
            tasks: Any, results: Any) -> None:
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    except Exception:
        results.put((rank, "error", traceback.format_exc()))
        return
    results.put((rank, "ready", None))
    comm = Comm(rank, world_size, device, backend)
    parent = os.getppid()
    try:
        while True:
            try:
                task = tasks.get(timeout=PARENT_CHECK_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            if task is None:
                return
            fn, args, kwargs = task
            comm.log.clear()
            try:
                results.put((rank, "ok", fn(comm, *args, **kwargs)))
            except Exception:
                results.put((rank, "error", traceback.format_exc()))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class RankPool:
    """`world_size` processes in one process group, started once, reused by `run`; a context manager."""

    def __init__(self, world_size: int, *, backend: str | None = None, num_threads: int | None = 1) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size: invalid value {world_size!r}; valid: an integer >= 1")
        if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                        or num_threads < 1):
            raise ValueError(f"num_threads: invalid value {num_threads!r}; valid: None (torch's default) or >= 1")
        backend = backend or default_backend(world_size)
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend: invalid value {backend!r}; valid: gloo, nccl")
        self.world_size, self.backend, self.num_threads = world_size, backend, num_threads
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        port = free_port()
        self._procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, num_threads, self._tasks[r],
                                                         self._results), daemon=True) for r in range(world_size)]
        for p in self._procs:
            p.start()
        self._closed = False
        try:
            self._collect("ready", START_TIMEOUT_S)
        except BaseException:
            self.close(kill=True)
            raise

    def _collect(self, expected: str, timeout_s: float | None) -> list[Any]:
        """Each rank's answer; the first rank error is raised once every rank has answered or, when some have
        not within ERROR_GRACE_S of it (stuck in a collective), after closing the pool."""
        found: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while len(found) + len(errors) < self.world_size:
            try:
                rank, kind, value = self._results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if r not in found and r not in errors and not p.is_alive()]
                if dead:
                    errors.setdefault(dead[0], f"process exited with code {self._procs[dead[0]].exitcode}")
                    break
                if deadline is not None and time.monotonic() > deadline:
                    if errors:
                        break
                    missing = sorted(set(range(self.world_size)) - set(found))
                    errors[missing[0]] = f"no answer within {timeout_s} s (ranks {missing})"
                    break
                continue
            if kind == expected:
                found[rank] = value
                continue
            errors[rank] = f"raised\n{value}" if kind == "error" else f"unexpected answer {kind!r}"
            if len(errors) == 1:
                deadline = min(math.inf if deadline is None else deadline, time.monotonic() + ERROR_GRACE_S)
        if errors:
            if len(found) + len(errors) < self.world_size:
                self.close(kill=True)
            rank = min(errors)
            raise RankError(rank, errors[rank])
        return [found[r] for r in range(self.world_size)]

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = RUN_TIMEOUT_S,
            **kwargs: Any) -> list[Any]:
        """fn(comm, *args, **kwargs) on every rank; the results in rank order. A rank's exception is a RankError
        naming the lowest failing rank, with its traceback; the pool is closed when a rank is stuck after it, or
        when no answer comes within `timeout_s` (None: wait without bound)."""
        if self._closed:
            raise RuntimeError("RankPool: closed (a rank failed or hung, or close() was called); start a new one")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        try:
            return self._collect("ok", timeout_s)
        except RankError:
            raise
        except BaseException:
            self.close(kill=True)
            raise

    def close(self, kill: bool = False) -> None:
        """Stop the processes: ask them to finish, or (kill) terminate them."""
        if self._closed:
            return
        self._closed = True
        if not kill:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=30)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(kill=exc[0] is not None)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str | None = None,
              num_threads: int | None = 1, **kwargs: Any) -> list[Any]:
    """fn(comm, *args, **kwargs) on `world_size` fresh processes; the results in rank order."""
    with RankPool(world_size, backend=backend, num_threads=num_threads) as pool:
        return pool.run(fn, *args, **kwargs)
