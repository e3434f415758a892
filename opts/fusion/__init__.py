"""fusion: memory traffic of three K3 steps, separate passes (off) against one fused pass (on).

- kda_decode: short causal conv update + recurrent KDA update + sigmoid-gated RMSNorm for one token per request;
- mla_norm: the MLA q and kv latent RMSNorms over the fused q_a/kv_a projection output;
- attn_res: the attention-residual softmax mix over the block states followed by RMSNorm.

off: `naive.py`, the stages as vLLM runs them without a fused kernel, with their intermediate tensors and
copies. on: `fused.py`, each mechanism as one inductor-compiled pass into `out=` buffers and states in place.
`reference.py` is the float64 truth both are tested against; `traffic.py` counts bytes, kernels and
allocations of each path. Math and measured numbers: README.md.
"""

from __future__ import annotations

from collections.abc import Callable

from opts.base import Optimization
from opts.fusion import naive, reference
from opts.fusion.cases import bench_cases
from opts.fusion.config import MECHANISMS, FusionConfig
from opts.fusion.fused import attn_res_fused, kda_decode_fused, mla_norm_fused
from opts.fusion.inputs import (
    AttnResLayer,
    AttnResStep,
    KdaDecodeLayer,
    KdaDecodeStep,
    MlaNormLayer,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
)
from opts.fusion.naive import attn_res_unfused, kda_decode_unfused, mla_norm_unfused
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape
from opts.fusion.traffic import PairCost, PathCost, attn_res_cost, kda_decode_cost, mla_norm_cost

__all__ = [
    "MECHANISMS",
    "OPTIMIZATION",
    "AttnResLayer",
    "AttnResShape",
    "AttnResStep",
    "FusionConfig",
    "KdaDecodeLayer",
    "KdaDecodeShape",
    "KdaDecodeStep",
    "MlaNormLayer",
    "MlaNormShape",
    "PairCost",
    "PathCost",
    "attn_res_cost",
    "attn_res_fused",
    "attn_res_unfused",
    "implementation",
    "kda_decode_cost",
    "kda_decode_fused",
    "kda_decode_unfused",
    "make_attn_res",
    "make_kda_decode",
    "make_mla_norm",
    "mla_norm_cost",
    "mla_norm_fused",
    "mla_norm_unfused",
    "naive",
    "reference",
]

_PATHS: dict[str, tuple[Callable, Callable]] = {
    "kda_decode": (kda_decode_unfused, kda_decode_fused),
    "mla_norm": (mla_norm_unfused, mla_norm_fused),
    "attn_res": (attn_res_unfused, attn_res_fused),
}


def implementation(config: FusionConfig, mechanism: str) -> Callable:
    """The function that runs `mechanism` under `config`: its fused pass when on, else its separate passes."""
    fused = config.is_fused(mechanism)
    off, on = _PATHS[mechanism]
    return on if fused else off


OPTIMIZATION = Optimization(
    name="fusion",
    description="KDA decode step, MLA q/kv RMSNorms and the attention-residual mix: separate passes with "
                "intermediates and copies (off) against one fused pass each (on)",
    config_cls=FusionConfig,
    bench_cases=bench_cases,
)
