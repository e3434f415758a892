"""fusion in the simulator: on, the mechanisms it lists run as one fused kernel each, priced by this package's
traffic accounting (`traffic.py`) at the sizes the simulator asks for, as a GPU kernel runs it: it streams its
inputs and outputs (intermediates on chip) and writes its new state rows to their slots itself (no store kernel);
off, the simulator's own stock pricing of vLLM's separate passes (`ablations/backends/sim/cost.py`, tested equal to
this package's off path).

The simulator decides where the fused path runs: the fused KDA decode only in a step that decodes and prefills
nothing, and never once speculation is configured (vLLM checks at construction: `amd/ops/kda_decode.py`,
`num_spec != 0`)."""

from __future__ import annotations

import torch

from opts.base import ToggleConfig
from opts.fusion.config import MECHANISMS
from opts.fusion.shapes import KdaDecodeShape, MlaNormShape
from opts.fusion.traffic import PathCost, kda_decode_cost, mla_norm_cost
from opts.sim_setting import SimSetting, StagePricing, StageTraffic, not_modelled
from opts.vllm_setting import check_platform

DTYPES = {2: torch.bfloat16, 4: torch.float32}
# The kernel class each side of this package's microbenchmarks runs as, by case-name prefix: the calibration
# fits the class's efficiency on those rows. The MLA norms only: the KDA decode's passes
# include the recurrence (another class), the attention residual's off is a counterfactual.
CALIBRATION = {"mla_norm_": {"off": "elementwise", "on": "elementwise"}}


def sim_setting(config: ToggleConfig, platform: str) -> SimSetting:
    """What `config` changes in the simulated engine on `platform`."""
    check_platform(platform)
    if config.mode == "off":
        return SimSetting()
    if config.mode == "on":
        return SimSetting(fused={m: FUSED[m] for m in MECHANISMS if config.is_fused(m)})
    raise not_modelled("fusion", config.mode, ("off", "on"))


def _dtype(nbytes: float) -> torch.dtype:
    if nbytes not in DTYPES:
        raise ValueError(f"fusion traffic: activations of {nbytes!r} bytes; valid: {', '.join(map(str, DTYPES))}")
    return DTYPES[nbytes]


def _stage(path: PathCost) -> StageTraffic:
    return StageTraffic(path.streamed_kernels, float(path.streamed_bytes))


def fused_kda_decode(num_tokens: int, num_heads: int, head_dim: int, conv_width: int,
                     act_bytes: float) -> StageTraffic:
    """The fused KDA decode of `num_tokens` one-token requests on a rank holding `num_heads` heads: conv update,
    recurrent update and gated RMSNorm in one kernel."""
    pair = kda_decode_cost(KdaDecodeShape(num_tokens, num_heads, head_dim, conv_width), _dtype(act_bytes),
                           one_row_as_two=False)
    return _stage(pair.on)


def fused_mla_norm(num_tokens: int, q_lora_rank: int, kv_lora_rank: int, act_bytes: float) -> StageTraffic:
    """The RMSNorms of the MLA q and kv latents over `num_tokens` tokens in one pass."""
    pair = mla_norm_cost(MlaNormShape(num_tokens, q_lora_rank, kv_lora_rank), _dtype(act_bytes), one_row_as_two=False)
    return _stage(pair.on)


def unfused(stage: str, *sizes: float) -> StageTraffic:
    """This package's off path of `stage` at `sizes` (a `StagePricing`'s arguments), as GPU kernels run it: what the
    simulator's stock pricing must equal."""
    if stage == "kda_decode":
        *shape, act_bytes = sizes
        return _stage(kda_decode_cost(KdaDecodeShape(*shape), _dtype(act_bytes), one_row_as_two=False).off)
    if stage == "mla_norm":
        *shape, act_bytes = sizes
        return _stage(mla_norm_cost(MlaNormShape(*shape), _dtype(act_bytes), one_row_as_two=False).off)
    raise ValueError(f"stage: invalid value {stage!r}; valid: {', '.join(MECHANISMS)}")


FUSED: dict[str, StagePricing] = {"kda_decode": fused_kda_decode, "mla_norm": fused_mla_norm}
