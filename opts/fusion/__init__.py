"""fusion: two K3 steps as vLLM's separate passes (off) against one fused pass (on), plus one counterfactual.

- kda_decode: short causal conv update + recurrent KDA update + sigmoid-gated RMSNorm for one token per request;
- mla_norm: the MLA q and kv latent RMSNorms over the fused q_a/kv_a projection output;
- attn_res (counterfactual, not toggled): the attention-residual softmax mix followed by RMSNorm; vLLM only
  has the fused kernel, so its unfused form (`counterfactual.py`) is measured beside the toggle.

off: `naive.py`, the stages vLLM runs, each its own pass at on's compilation level. on: `passes.py`, each
mechanism as one inductor-compiled pass. One implementation per pass, in vLLM's calling conventions over its
state slot pools (`slots.py`), compiled by `dynamic.py` for any batch size: what the vLLM patches run
(`vllm.py`, the toggle's setting per platform) and what the microbenchmarks time (`cases.py`). `stages.py`
holds the math both compile; `reference.py` the float64 truth; `traffic.py` counts bytes, kernels and
allocations of each path; `fused.py` / `counterfactual.py` the attention residual. On a CPU neither mode is
stock (stock vLLM-CPU runs these steps eagerly). Math and measured numbers: README.md.
"""

from __future__ import annotations

from collections.abc import Callable

from opts.base import Optimization
from opts.fusion import counterfactual, naive, passes, reference, sim, slots, stages, vllm
from opts.fusion.cases import bench_cases
from opts.fusion.config import COUNTERFACTUAL, MECHANISMS, FusionConfig
from opts.fusion.counterfactual import attn_res_unfused
from opts.fusion.fused import attn_res_fused
from opts.fusion.inputs import (
    AttnResLayer,
    AttnResStep,
    KdaDecodeLayer,
    KdaDecodeStep,
    MlaNormLayer,
    decode_args,
    make_attn_res,
    make_kda_decode,
    make_mla_norm,
    norm_args,
    slot_pools,
)
from opts.fusion.naive import kda_decode_slots_unfused, q_kv_rms_norm
from opts.fusion.passes import kda_decode_slots_fused, q_kv_rms_norm_fused
from opts.fusion.shapes import AttnResShape, KdaDecodeShape, MlaNormShape
from opts.fusion.traffic import Kernel, PairCost, PathCost, attn_res_cost, kda_decode_cost, mla_norm_cost

__all__ = [
    "COUNTERFACTUAL",
    "MECHANISMS",
    "OPTIMIZATION",
    "AttnResLayer",
    "AttnResShape",
    "AttnResStep",
    "FusionConfig",
    "KdaDecodeLayer",
    "KdaDecodeShape",
    "KdaDecodeStep",
    "Kernel",
    "MlaNormLayer",
    "MlaNormShape",
    "PairCost",
    "PathCost",
    "attn_res_cost",
    "attn_res_fused",
    "attn_res_unfused",
    "counterfactual",
    "decode_args",
    "implementation",
    "kda_decode_cost",
    "kda_decode_slots_fused",
    "kda_decode_slots_unfused",
    "make_attn_res",
    "make_kda_decode",
    "make_mla_norm",
    "mla_norm_cost",
    "naive",
    "norm_args",
    "passes",
    "q_kv_rms_norm",
    "q_kv_rms_norm_fused",
    "reference",
    "sim",
    "slot_pools",
    "slots",
    "stages",
    "vllm",
]

_PATHS: dict[str, tuple[Callable, Callable]] = {
    "kda_decode": (kda_decode_slots_unfused, kda_decode_slots_fused),
    "mla_norm": (q_kv_rms_norm, q_kv_rms_norm_fused),
}


def implementation(config: FusionConfig, mechanism: str) -> Callable:
    """The function that runs `mechanism` under `config`, in vLLM's calling conventions (`decode_args`,
    `norm_args`): its fused pass when on, else vLLM's separate passes."""
    fused = config.is_fused(mechanism)
    off, on = _PATHS[mechanism]
    return on if fused else off


OPTIMIZATION = Optimization(
    name="fusion",
    description="KDA decode step and MLA q/kv RMSNorms: vLLM's separate passes, each compiled like the fused "
                "one (off), against one fused pass each (on); attention residual as a counterfactual beside",
    config_cls=FusionConfig,
    bench_cases=bench_cases,
    vllm_setting=vllm.vllm_setting,
    stock_modes=vllm.STOCK_MODES,
    sim_setting=sim.sim_setting,
    removes_work=("on",),       # fewer launches and bytes per step; the fused KDA decode only where vLLM runs it
)
