"""aiter_mla: K3's MLA decode over the paged latent cache, generic (off) against specialized (on).

off: `naive.decode`, gather each request's pages into a contiguous context, attend, apply W_UV.
on: `split_kv.decode` (portable PyTorch: tiles read from the pages where they lie, one pass, exact
log-sum-exp merge) or, on ROCm with amd-aiter, AITER's `mla_decode_fwd` (`aiter.py`, unexecuted here).
`reference.decode` is the float64 un-absorbed truth both are tested against; `vllm_cpu` runs vLLM's CPU
MLA kernel on the same inputs for comparison. Math, measurements: README.md.
"""

from __future__ import annotations

from opts.aiter_mla import aiter, naive, reference, split_kv, vllm_cpu
from opts.aiter_mla.bench import bench_cases
from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.dispatch import BACKENDS, make_decode, select_backend
from opts.aiter_mla.inputs import DecodeInputs, make_inputs
from opts.aiter_mla.mla import K3_TP8, MLAShape, absorb_query, decode_bytes, decode_flops, up_project
from opts.base import Optimization

__all__ = [
    "BACKENDS",
    "K3_TP8",
    "OPTIMIZATION",
    "AiterMLAConfig",
    "DecodeInputs",
    "MLAShape",
    "absorb_query",
    "aiter",
    "decode_bytes",
    "decode_flops",
    "make_decode",
    "make_inputs",
    "naive",
    "reference",
    "select_backend",
    "split_kv",
    "up_project",
    "vllm_cpu",
]

OPTIMIZATION = Optimization(
    name="aiter_mla",
    description="MLA decode over the paged latent cache: generic gather-then-attend (off) against split-KV "
                "read in place, or AITER's mla_decode_fwd on ROCm (on)",
    config_cls=AiterMLAConfig,
    bench_cases=bench_cases,
)
