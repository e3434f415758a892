"""Analytic traffic of each path: bytes moved, kernels launched, memory allocated, from the shapes alone.

The model (README.md): a kernel reads every tensor it consumes once and writes every tensor it produces once;
data does not stay in cache from one kernel to the next. A path is its kernels in the order the code runs
them: compiled passes (one inductor kernel each; the intermediates inductor still materialises are written and
read back once), eager aten ops (copies), and the stores that scatter a pass's new state rows to their slots.
The toggled mechanisms' paths are the engine's (`naive.py` / `passes.py`), a one-row step included (run as two
rows, `dynamic.as_two_rows`, with the copies that costs). Tests check the counts against a dispatch-level
count, torch.profiler and inductor's generated code (`bench/measured_traffic.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from opts.fusion.inputs import F32_BYTES as F32
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape

SLOT = 4        # vLLM's slot indices: int32
INDEX = 8       # a pass's gathered slot indices: int64
KINDS = ("compiled", "dynamic", "aten", "store")


@dataclass(frozen=True)
class Kernel:
    """One kernel: bytes read and written, the tensors its call returns new (`outputs`) and the intermediates it
    writes and reads back (`scratch`), bytes each, and its kind: "compiled" (an inductor pass compiled for exact
    shapes, `compiled.py`), "dynamic" (one compiled for any token count, `dynamic.py`), "aten" (an eager op) or
    "store" (the eager `index_put_` scattering a pass's new state rows to their slots). `index`: the bytes of
    the slot indices among a pass's outputs, handed to the stores."""

    name: str
    read: int
    written: int
    outputs: tuple[int, ...] = ()
    scratch: tuple[int, ...] = ()
    kind: str = "aten"
    index: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Kernel.kind: invalid value {self.kind!r}; valid choices: {', '.join(KINDS)}")

    @property
    def allocs(self) -> tuple[int, ...]:
        """Every tensor the call allocates."""
        return self.outputs + self.scratch

    @property
    def streamed(self) -> int:
        """Bytes as a GPU kernel moves them: intermediates kept on chip, new state rows written to their slots
        (no slot indices handed over)."""
        return self.read + self.written - 2 * sum(self.scratch) - self.index


@dataclass(frozen=True)
class PathCost:
    """One path per call: its kernels in order and the tensors it allocates outside them (torch.empty)."""

    steps: tuple[Kernel, ...]
    empties: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(k.read + k.written for k in self.steps)

    @property
    def kernels(self) -> int:
        return len(self.steps)

    @property
    def streamed_bytes(self) -> int:
        """Bytes as GPU kernels run the path: each pass keeps its intermediates on chip and writes its new state
        rows to their slots itself, as vLLM's GPU decode kernels do (no store, no index tensor handed over)."""
        return sum(k.streamed for k in self.steps if k.kind != "store")

    @property
    def streamed_kernels(self) -> int:
        """Kernels as GPU kernels run the path: no stores."""
        return self.kernels - len(self.of_kind("store"))

    @property
    def allocations(self) -> int:
        return len(self.empties) + sum(len(k.allocs) for k in self.steps)

    @property
    def allocated(self) -> int:
        return sum(self.empties) + sum(sum(k.allocs) for k in self.steps)

    def of_kind(self, *kinds: str) -> tuple[Kernel, ...]:
        """The kernels of these kinds, in order."""
        return tuple(k for k in self.steps if k.kind in kinds)

    @property
    def eager_allocated(self) -> tuple[int, ...]:
        """What eager code allocates (what a dispatch mode sees): torch.empty and aten outputs."""
        return self.empties + tuple(b for k in self.of_kind("aten") for b in k.outputs)

    @property
    def allocator_events(self) -> tuple[int, ...]:
        """The allocations torch.profiler attributes to the call, bytes each: the eager ones, every buffer of a
        pass compiled for exact shapes (called past any wrapper), and per dynamic pass its outputs as one event
        (torch.compile's call event nets out the scratch it frees before returning)."""
        dynamic = tuple(sum(k.outputs) for k in self.of_kind("dynamic") if k.outputs)
        return self.eager_allocated + tuple(b for k in self.of_kind("compiled") for b in k.allocs) + dynamic


@dataclass(frozen=True)
class PairCost:
    """Off and on of one mechanism, and the compulsory bytes: every input read once, every output written once."""

    off: PathCost
    on: PathCost
    compulsory: int

    def info(self) -> dict[str, int]:
        """The fields a benchmark row carries."""
        return {"bytes_off": self.off.bytes, "bytes_on": self.on.bytes, "bytes_compulsory": self.compulsory,
                "kernels_off": self.off.kernels, "kernels_on": self.on.kernels,
                "allocations_off": self.off.allocations, "allocated_bytes_off": self.off.allocated,
                "allocations_on": self.on.allocations, "allocated_bytes_on": self.on.allocated}


@dataclass
class _Path:
    steps: list[Kernel] = field(default_factory=list)
    empties: list[int] = field(default_factory=list)

    def empty(self, nbytes: int) -> None:
        self.empties.append(nbytes)

    def compiled(self, name: str, read: int, written: int, intermediates: list[int]) -> None:
        extra = sum(intermediates)
        self.steps.append(Kernel(name, read + extra, written + extra, (), tuple(intermediates), "compiled"))

    def dynamic(self, name: str, read: int, written: int, outputs: list[int], intermediates: list[int],
                index: int = 0) -> None:
        """A dynamic pass: `read` and `written` (in place) bytes of its arguments, the new tensors it returns
        (`index` bytes of them the slot indices)."""
        extra = sum(intermediates)
        self.steps.append(Kernel(name, read + extra, written + sum(outputs) + extra, tuple(outputs),
                                 tuple(intermediates), "dynamic", index))

    def aten(self, name: str, read: int, written: int) -> None:
        self.steps.append(Kernel(name, read, written))

    def store(self, index: int, rows: int) -> None:
        self.steps.append(Kernel("index_put_", index + rows, rows, kind="store"))

    def cost(self) -> PathCost:
        return PathCost(tuple(self.steps), tuple(self.empties))


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class _TokenArg:
    """A per-token argument as the step hands it over: one row's bytes, and the elements a copy of two rows laid
    out as it spans (its storage offset and strides kept, `dynamic.two_rows`)."""

    row: int
    extent: int
    itemsize: int


def _one_row(two: PairCost, args: list[_TokenArg], out_row: int | None, compulsory: int) -> PairCost:
    """A one-row step as the code runs it, off and on: each per-token argument copied into two equal rows, the
    two-row path, then (`out_row`) row 0 of the written output copied back."""
    return PairCost(_one_row_path(two.off, args, out_row), _one_row_path(two.on, args, out_row), compulsory)


def _one_row_path(two: PathCost, args: list[_TokenArg], out_row: int | None) -> PathCost:
    path = _Path()
    for a in args:
        path.empty(a.extent * a.itemsize)
        path.aten("copy_", a.row, 2 * a.row)
    steps = path.steps + list(two.steps)
    if out_row is not None:
        steps.append(Kernel("copy_", out_row, out_row))
    return PathCost(tuple(steps), tuple(path.empties) + two.empties)


def _row_arg(row_elems: int, offset: int, row_stride: int, itemsize: int) -> _TokenArg:
    return _TokenArg(row_elems * itemsize, offset + row_stride + row_elems, itemsize)


def mla_norm_cost(shape: MlaNormShape, dtype: torch.dtype, one_row_as_two: bool = True) -> PairCost:
    """The q and kv RMSNorms over [N, q_lora] and [N, kv_lora], views of the projection output: two passes each
    into a new tensor (off) or one pass returning both (on). `one_row_as_two`: a one-row step as the engine's
    passes run it (two rows, `dynamic.as_two_rows`); False: as one row (a GPU kernel)."""
    es, n, q, kv = _size(dtype), shape.num_tokens, shape.q_lora_rank, shape.kv_lora_rank
    latent = q + kv
    compulsory = 2 * n * latent * es + latent * es
    if n == 1 and one_row_as_two:
        two = mla_norm_cost(replace(shape, num_tokens=2), dtype)
        args = [_row_arg(q, 0, shape.width, es), _row_arg(kv, q, shape.width, es)]
        return _one_row(two, args, None, compulsory)
    off = _Path()
    for dim in (q, kv):
        off.empty(n * dim * es)
        off.dynamic("rms_norm", n * dim * es + dim * es, n * dim * es, [], [n * F32])
    on = _Path()
    on.dynamic("dual rms_norm", n * latent * es + latent * es, 0, [n * q * es, n * kv * es], [n * F32, n * F32])
    return PairCost(off.cost(), on.cost(), compulsory)


def kda_decode_cost(shape: KdaDecodeShape, dtype: torch.dtype, one_row_as_two: bool = True) -> PairCost:
    """Conv update + recurrent update + gated RMSNorm for N one-token requests, the states gathered from and
    stored to vLLM's slot pools. Intermediates: those inductor materialises for bf16 activations.
    `one_row_as_two`: as `mla_norm_cost`'s."""
    es = _size(dtype)
    n, h, d, w, c = shape.num_tokens, shape.num_heads, shape.head_dim, shape.conv_width, shape.channels
    nc, nhd, nh, hd = n * c, n * h * d, n * h, h * d
    state, window, index, slots = n * h * d * d * F32, nc * (w - 1) * es, n * INDEX, n * SLOT
    x_read = nc * es + window + c * w * es + slots
    rec_read = nhd * es + nh * es + h * F32 + hd * F32 + state
    norm_read = nhd * es + d * es
    compulsory = x_read + rec_read + norm_read + window + state + nhd * es
    if n == 1 and one_row_as_two:
        two = kda_decode_cost(replace(shape, num_tokens=2), dtype)
        p = shape.projection_width
        args = [_row_arg(c, 0, p, es), _TokenArg(hd * es, 2 * hd, es), _row_arg(h, shape.beta_offset, p, es),
                _TokenArg(SLOT, 2, SLOT), _row_arg(hd, shape.gate_offset, p, es), _TokenArg(hd * es, 2 * hd, es)]
        return _one_row(two, args, hd * es, compulsory)
    off = _Path()
    off.dynamic("conv", x_read, 0, [nc * es, index, window], [window], index)
    off.store(index, window)
    off.dynamic("recurrence", nc * es + rec_read + slots, 0, [nhd * es, index, state],
                [h * F32] + [nhd * F32] * 3 + [nh * F32] * 4, index)
    off.store(index, state)
    off.aten("copy_", nhd * es, nhd * es)
    off.empty(nhd * es)
    off.dynamic("gated rms_norm", nhd * es + norm_read, nhd * es, [], [nh * F32])
    off.aten("copy_", nhd * es, nhd * es)
    on = _Path()
    on.dynamic("kda decode", x_read + rec_read + norm_read, nhd * es, [index, window, state],
               [window, nc * F32, h * F32] + [nhd * F32] * 3 + [nh * F32] * 5, index)
    on.store(index, window)
    on.store(index, state)
    return PairCost(off.cost(), on.cost(), compulsory)


def attn_res_cost(shape: AttnResShape, dtype: torch.dtype) -> PairCost:
    """Delta add, block store, softmax mix over the sources and output RMSNorm for T tokens; each path
    allocates its output. Off is the counterfactual split (mix pass, then RMSNorm pass)."""
    es = _size(dtype)
    t, hid, nb, s = shape.num_tokens, shape.hidden, shape.num_blocks, shape.num_sources
    row = t * hid
    read = row * es * (1 + nb) + (row * es if shape.has_delta else 0) + (2 * hid * es if nb > 0 else 0)
    written = (row * es if shape.has_delta else 0) + (row * es if shape.block_write else 0)
    stats = 2 * s + (1 if shape.has_delta else 0) if nb > 0 else 0
    off = _Path()
    off.empty(row * es)
    off.compiled("mix", read, written + row * es, [t * F32] * stats)
    off.empty(row * es)
    off.compiled("rms_norm", row * es + hid * es, row * es, [t * F32])
    on = _Path()
    on.empty(row * es)
    on.compiled("attn_res", read + hid * es, written + row * es,
                [row * F32] + [t * F32] * (stats + 1) if nb > 0 else [t * F32])
    return PairCost(off.cost(), on.cost(), read + hid * es + written + row * es)
