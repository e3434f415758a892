"""How the fusion toggle reaches vLLM, per platform (README.md, "The toggle inside vLLM").

CPU: no mode is stock. Stock vLLM-CPU (with the project's CPU fixes) runs these steps eagerly, op by op, while
fusion compares compiled passes: both modes patch vLLM at one compilation level.
- off: `fused_q_kv_rmsnorm` becomes two compiled RMSNorm passes (`naive.q_kv_rms_norm`); a plain decode step
  (no prefill, no speculation) of `KimiK3DeltaAttention._forward` runs `naive.kda_decode_slots_unfused`: the
  conv update, recurrence and gated norm as three compiled passes with vLLM's tensors and copies between them.
- on: `fused_q_kv_rmsnorm` becomes one compiled dual norm (`engine.q_kv_rms_norm_fused`); a plain decode
  step runs `engine.kda_decode_slots_fused`, one compiled pass, as vLLM's `fused_kda_decode` branch on GPUs.
Every other step runs `_forward` unchanged.
CUDA: stock vLLM is on; the KDA decode has vLLM's own switch, the q/kv norms have no unfused path.
ROCm: not wired (which cell stock is depends on AITER and MTP).
"""

from __future__ import annotations

from typing import Any

from opts.fusion import engine, naive
from opts.fusion.config import MECHANISMS, FusionConfig
from opts.vllm_setting import K3_VLLM, KDA_FORWARD, Patch, VllmSetting, check_platform, not_wired

NAME = "fusion"
STOCK_MODES = {"cuda": "on"}

MLA_NORM_TARGET = f"{K3_VLLM}.mla:fused_q_kv_rmsnorm"
KDA_FORWARD_TARGET = KDA_FORWARD
KDA_FUSED_TARGET = f"{engine.__name__}:kda_decode_slots_fused"
KDA_UNFUSED_TARGET = f"{naive.__name__}:kda_decode_slots_unfused"
MLA_COUNTER = "fusion_mla_norm_fused"
KDA_COUNTER = "fusion_kda_decode_fused"
MLA_UNFUSED_COUNTER = "fusion_mla_norm_unfused"
KDA_UNFUSED_COUNTER = "fusion_kda_decode_unfused"

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


def decode_step_args(layer: Any, m: Any, mixed_qkv, g1, g2, beta, core_attn_out) -> tuple:
    """The arguments of `engine.kda_decode_slots_fused` / `naive.kda_decode_slots_unfused` for a plain decode
    step of `layer` (vLLM's KimiK3DeltaAttention), from those of its `_forward`; rows past the step's tokens
    are left out, as vLLM's fused kernels leave them."""
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    n = m.num_actual_tokens
    conv_state, recurrent_state = layer.kv_cache[:2]
    if not is_conv_state_dim_first():
        conv_state = conv_state.transpose(-1, -2)
    weight = layer.conv1d.weight.data
    gate = g2[:n]
    if n == 1:
        # forward()'s rearrange recomputes a one-row view's row stride; give it the projection's, as every other
        # step has, so that its two-row form meets the same compiled graph (dynamic.as_two_rows)
        gate = gate.as_strided(gate.shape, (mixed_qkv.stride(0), *gate.stride()[1:]))
    return (mixed_qkv[:n], conv_state, weight.view(weight.size(0), weight.size(2)), g1[0, :n], beta[0, :n],
            layer.A_log.data, layer.dt_bias.data, recurrent_state, m.non_spec_state_indices_tensor[:n], gate,
            layer.o_norm.weight.data, core_attn_out[0, :n], layer.gate_lower_bound, layer.head_dim ** -0.5,
            layer.o_norm.eps)


def route_plain_decode(base: Any, fused: bool) -> Any:
    """Wrap `KimiK3DeltaAttention._forward`: a plain decode step runs the fused pass (`fused`) or off's separate
    passes, every other step `base`."""

    def _forward(self, mixed_qkv, g1, g2, beta, core_attn_out) -> None:
        m = _plain_decode(self)
        # as vLLM's own fused decode: no speculative config (its conv state is wider), no conv bias (K3 has none)
        if m is None or self.num_spec or self.conv1d.bias is not None:
            return base(self, mixed_qkv=mixed_qkv, g1=g1, g2=g2, beta=beta, core_attn_out=core_attn_out)
        # looked up per call: the counting patches replace these module attributes
        decode = engine.kda_decode_slots_fused if fused else naive.kda_decode_slots_unfused
        decode(*decode_step_args(self, m, mixed_qkv, g1, g2, beta, core_attn_out))
        return None

    _forward.__wrapped__ = base  # type: ignore[attr-defined]
    return _forward


def _put(new: Any) -> Any:
    return lambda _stock: new


def _same(value: Any) -> Any:
    return value


# fused? -> (replacement, counter, what it runs)
NORM_PASSES = {
    False: (naive.q_kv_rms_norm, MLA_UNFUSED_COUNTER, "two compiled passes (naive.q_kv_rms_norm, vLLM's RMSNorm math)"),
    True: (engine.q_kv_rms_norm_fused, MLA_COUNTER, "one compiled pass (engine.q_kv_rms_norm_fused, vLLM's fused "
           "kernel's math)"),
}
# fused? -> (the pass's attribute, counted there; counter; what it runs)
DECODE_PASSES = {
    False: (KDA_UNFUSED_TARGET, KDA_UNFUSED_COUNTER, "three compiled passes with vLLM's tensors and copies between "
            "them (naive.kda_decode_slots_unfused)"),
    True: (KDA_FUSED_TARGET, KDA_COUNTER, "one compiled pass (engine.kda_decode_slots_fused, as vLLM's "
           "fused_kda_decode branch)"),
}


SPECULATING = ("a speculating engine runs no plain decode step (every decode step verifies drafts), so the KDA "
               "decode route never runs")


def cpu_patches(mechanism: str, fused: bool) -> tuple[Patch, ...]:
    """The CPU patches that run `mechanism` fused or unfused."""
    mode = "on" if fused else "off"
    if mechanism == "mla_norm":
        new, counter, runs = NORM_PASSES[fused]
        return (Patch(MLA_NORM_TARGET, _put(new), f"fusion {mode}: the q/kv RMSNorms as {runs} instead of CPU fix "
                      "S15's two eager ones", counter),)
    target, counter, runs = DECODE_PASSES[fused]
    return (
        Patch(KDA_FORWARD_TARGET, lambda base: route_plain_decode(base, fused), f"fusion {mode}: a plain decode "
              f"step runs conv update, recurrence and gated norm as {runs} instead of CPU fixes S8, S4 and vLLM's "
              "eager o_norm; every other step unchanged"),
        Patch(target, _same, f"fusion {mode}: counts the KDA decode steps the _forward patch runs", counter,
              idle_with=(("speculative_config", SPECULATING),)),
    )


def vllm_setting(config: FusionConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`: each mechanism runs fused or unfused as `config` says."""
    check_platform(platform)
    if not isinstance(config, FusionConfig):
        raise TypeError(f"fusion vllm_setting: expected a FusionConfig, got {type(config).__name__}")
    if platform == "cpu":
        return VllmSetting(patches=tuple(p for m in MECHANISMS for p in cpu_patches(m, config.is_fused(m))))
    unfused = [m for m in MECHANISMS if not config.is_fused(m)]
    if platform == "cuda":
        if "mla_norm" in unfused:
            raise not_wired(NAME, config.mode, platform, CUDA_NO_UNFUSED_NORM, ("on",))
        return VllmSetting(additional_config={"kda_decode_backend": "triton"} if "kda_decode" in unfused else {})
    raise not_wired(NAME, config.mode, platform, ROCM_WHY, ())
