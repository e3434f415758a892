"""Analytic traffic of each path: bytes moved, kernels launched, memory allocated, from the shapes alone.

The model (README.md): a kernel reads every tensor it consumes once and writes every tensor it produces
once; data does not stay in cache from one kernel to the next. Off: one kernel per top-level aten op of
`naive.py`, each listed below in the order the code runs it (tests check the totals against a dispatch-level
count and torch.profiler). On: one fused kernel that reads the inputs once, writes the outputs and states
once, and writes and reads back the intermediates inductor still materialises (tests check those against
inductor's generated code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape

F32 = 4


@dataclass(frozen=True)
class PathCost:
    """One path's bytes moved, kernels and allocations (count and bytes) per call."""

    bytes: int
    kernels: int
    allocations: int
    allocated: int


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
class _Ledger:
    """Ops of an eager path: (bytes read, bytes written) each, and the tensors they allocate."""

    ops: list[tuple[int, int]] = field(default_factory=list)
    allocs: list[int] = field(default_factory=list)

    def op(self, read: int, written: int, fresh: bool = True) -> None:
        self.ops.append((read, written))
        if fresh:
            self.allocs.append(written)

    def alloc(self, nbytes: int) -> None:
        self.allocs.append(nbytes)

    def cost(self) -> PathCost:
        return PathCost(sum(r + w for r, w in self.ops), len(self.ops), len(self.allocs), sum(self.allocs))


def _fused(compulsory: int, intermediates: list[int]) -> PathCost:
    return PathCost(compulsory + 2 * sum(intermediates), 1, len(intermediates), sum(intermediates))


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _rms_norm_native(ledger: _Ledger, rows: int, dim: int, es: int) -> None:
    """`naive.rms_norm_native` on [rows, dim] in a dtype of `es` bytes, weight in the same dtype."""
    x = rows * dim
    if es != F32:
        ledger.op(x * es, x * F32)                      # x.to(float32)
    ledger.op(x * F32, x * F32)                         # pow
    ledger.op(x * F32, rows * F32)                      # mean
    ledger.op(rows * F32, rows * F32)                   # + eps
    ledger.op(rows * F32, rows * F32)                   # rsqrt
    ledger.op(x * F32 + rows * F32, x * F32)            # x * rstd
    if es != F32:
        ledger.op(x * F32, x * es)                      # .to(weight.dtype)
    ledger.op(x * es + dim * es, x * es)                # * weight


def mla_norm_cost(shape: MlaNormShape, dtype: torch.dtype) -> PairCost:
    """The dual RMSNorm over [N, q_lora] and [N, kv_lora] of the projection output."""
    es, n = _size(dtype), shape.num_tokens
    off = _Ledger()
    for dim in (shape.q_lora_rank, shape.kv_lora_rank):
        _rms_norm_native(off, n, dim, es)
    latent = shape.q_lora_rank + shape.kv_lora_rank
    compulsory = 2 * n * latent * es + latent * es
    return PairCost(off.cost(), _fused(compulsory, [n * F32, n * F32]), compulsory)


def kda_decode_cost(shape: KdaDecodeShape, dtype: torch.dtype, lower_bound: float | None = -5.0) -> PairCost:
    """Conv update + recurrent update + gated RMSNorm for N one-token requests."""
    es = _size(dtype)
    n, h, d, w, c = shape.num_tokens, shape.num_heads, shape.head_dim, shape.conv_width, shape.channels
    nc, nhd, nh, state = n * c, n * h * d, n * h, n * h * d * d * F32
    off = _Ledger()
    off.alloc(nc * es)                                                  # conv_out = torch.empty
    off.op(nc * (w - 1) * es + nc * es, nc * w * es)                    # cat(conv_state, x)
    if es != F32:
        off.op(nc * w * es, nc * w * F32)                               # .to(weight.dtype)
    off.op(nc * (w - 1) * F32, nc * (w - 1) * es, fresh=False)          # conv_state.copy_
    off.op(nc * w * F32 + c * w * F32, nc * F32)                        # conv1d
    off.op(nc * F32, nc * F32)                                          # silu
    off.op(nc * F32, nc * es, fresh=False)                              # conv_out.copy_
    if es != F32:
        off.op(nc * es, nc * F32)                                       # conv_out.float()
    for is_q in (True, False):                                          # L2 norm of q (then scale) and k
        off.op(nhd * F32, nhd * F32)                                    # x * x
        off.op(nhd * F32, nh * F32)                                     # sum
        off.op(nh * F32, nh * F32)                                      # + eps
        off.op(nh * F32, nh * F32)                                      # sqrt
        off.op(nhd * F32 + nh * F32, nhd * F32)                         # x / norm
        if is_q:
            off.op(nhd * F32, nhd * F32)                                # * scale
    if es != F32:
        off.op(nhd * es, nhd * F32)                                     # raw_g.float()
    off.op(nhd * F32 + h * d * F32, nhd * F32)                          # + dt_bias
    off.op(h * F32, h * F32)                                            # A_log.exp()
    if lower_bound is None:
        off.op(h * F32, h * F32)                                        # -a
        off.op(nhd * F32, nhd * F32)                                    # softplus
        off.op(h * F32 + nhd * F32, nhd * F32)                          # -a * softplus
    else:
        off.op(h * F32 + nhd * F32, nhd * F32)                          # a * x
        off.op(nhd * F32, nhd * F32)                                    # sigmoid
        off.op(nhd * F32, nhd * F32)                                    # * lower_bound
    if es != F32:
        off.op(nh * es, nh * F32)                                       # raw_beta.float()
    off.op(nh * F32, nh * F32)                                          # sigmoid
    off.op(nhd * F32, nhd * F32)                                        # g.exp()
    off.op(state + nhd * F32, state, fresh=False)                       # state.mul_
    off.op(state + nhd * F32, nhd * F32)                                # state @ k
    off.op(2 * nhd * F32, nhd * F32)                                    # v - state k
    off.op(nhd * F32 + nh * F32, nhd * F32)                             # * beta
    off.op(state + 2 * nhd * F32, state, fresh=False)                   # baddbmm_
    off.op(state + nhd * F32, nhd * F32)                                # state @ q
    if es != F32:
        off.op(nhd * F32, nhd * es)                                     # o.to(dtype)
    off.op(nhd * es, nhd * es, fresh=False)                             # out.copy_(o)
    if es != F32:
        off.op(nhd * es, nhd * F32)                                     # x.float()
    off.op(nhd * F32, nhd * F32)                                        # pow
    off.op(nhd * F32, nh * F32)                                         # mean
    off.op(nh * F32, nh * F32)                                          # + eps
    off.op(nh * F32, nh * F32)                                          # rsqrt
    off.op(nhd * F32 + nh * F32, nhd * F32)                             # x * rstd
    if es != F32:
        off.op(d * es, d * F32)                                         # weight.float()
    off.op(nhd * F32 + d * F32, nhd * F32)                              # * weight
    if es != F32:
        off.op(nhd * es, nhd * F32)                                     # gate.float()
    off.op(nhd * F32, nhd * F32)                                        # sigmoid
    off.op(2 * nhd * F32, nhd * F32)                                    # * sigmoid(gate)
    if es != F32:
        off.op(nhd * F32, nhd * es)                                     # .to(dtype)
    off.op(nhd * es, nhd * es, fresh=False)                             # out.copy_
    compulsory = (nc * es + 2 * nc * (w - 1) * es + c * w * F32       # x; conv_state read + written; conv weight
                  + nhd * es + nh * es + h * F32 + h * d * F32          # raw_g, raw_beta, A_log, dt_bias
                  + 2 * state + nhd * es + d * es + nhd * es)           # state read + written, gate, norm w, out
    intermediates = [nc * (w - 1) * es, nc * F32] + [nhd * F32] * 4 + [nh * F32] * 6
    return PairCost(off.cost(), _fused(compulsory, intermediates), compulsory)


def attn_res_cost(shape: AttnResShape, dtype: torch.dtype) -> PairCost:
    """Delta add, block store, softmax mix over the sources and output RMSNorm for T tokens."""
    es = _size(dtype)
    t, hid, nb, s = shape.num_tokens, shape.hidden, shape.num_blocks, shape.num_sources
    row = t * hid
    off = _Ledger()
    if shape.has_delta:
        off.op(2 * row * es, row * es, fresh=False)                     # prefix.add_(delta)
    if shape.block_write:
        off.op(row * es, row * es, fresh=False)                         # blocks[:, i].copy_(prefix)
    if nb > 0:
        _rms_norm_native(off, t * nb, hid, es)                          # norm of the completed blocks
        off.op(t * nb * hid * es + hid * es, t * nb * es)               # linear: learned query
        _rms_norm_native(off, t, hid, es)                               # norm of the partial block
        off.op(row * es + hid * es, t * es)                             # linear
        off.op(t * nb * es + t * es, t * s * es)                        # cat logits
        if es != F32:
            off.op(t * s * es, t * s * F32)                             # .float()
        off.op(t * s * F32, t * s * F32)                                # softmax
        if es != F32:
            off.op(t * s * F32, t * s * es)                             # .to(dtype)
        off.op(row * es + t * es, row * es)                             # prefix * weight
        off.op(row * es + t * nb * es + t * nb * hid * es, row * es)    # baddbmm over the blocks
    _rms_norm_native(off, t, hid, es)                                   # output norm
    compulsory = (row * es * (1 + nb + 1)                              # prefix, completed blocks read; out
                  + (2 * row * es if shape.has_delta else 0)            # delta read, prefix written
                  + (row * es if shape.block_write else 0)              # block stored
                  + (3 if nb > 0 else 1) * hid * es)                    # weights
    intermediates = [row * F32] + [t * F32] * (2 * s + 2) if nb > 0 else [t * F32]
    return PairCost(off.cost(), _fused(compulsory, intermediates), compulsory)
