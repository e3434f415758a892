"""How the fusion toggle reaches vLLM, per platform (README.md, "The toggle inside vLLM").

CPU: no mode is stock. Stock vLLM-CPU (with the project's CPU fixes) runs these steps eagerly, op by op, while
fusion compares compiled passes: both modes patch vLLM at one compilation level.
- off: `fused_q_kv_rmsnorm` becomes two compiled RMSNorm passes (`naive.q_kv_rms_norm`); a plain decode step
  (no prefill, no speculation) of `KimiK3DeltaAttention._forward` runs `naive.kda_decode_slots_unfused`: the
  conv update, recurrence and gated norm as three compiled passes with vLLM's tensors and copies between them.
- on: `fused_q_kv_rmsnorm` becomes one compiled dual norm (`passes.q_kv_rms_norm_fused`); a plain decode
  step runs `passes.kda_decode_slots_fused`, one compiled pass, as vLLM's `fused_kda_decode` branch on GPUs.
Every other step runs `_forward` unchanged.
CUDA: stock vLLM is on. The KDA decode has vLLM's own switch (`kda_decode_backend`); the q/kv norms have no
unfused path in vLLM, so off's is a counterfactual: `nvidia.mla:fused_q_kv_rmsnorm` becomes `naive.q_kv_rms_norm`,
two compiled RMSNorm passes, as on the CPU.
ROCm: both modes patched, whatever the AITER and MTP settings (`rocm_patches`). The q/kv norms
(`KimiK3MultiHeadLatentAttentionWrapper._normalize_q_kv`, amd/mla.py:72-90): on calls AITER's fused dual
RMSNorm (`torch.ops.vllm.fused_mla_dual_rms_norm`, amd/mla.py:81-88) always, where stock calls it only with
AITER on and outside torch.compile; off calls the two RMSNorm layers (amd/mla.py:90). The KDA decode: off makes
`is_fused_kda_decode_supported` (amd/kda.py:188-196) answer no, so each layer is built without the decode weights
and a plain decode step takes the conv update, recurrence and gated norm (amd/kda.py:423-); on keeps vLLM's
answer and counts `vllm._custom_ops.fused_kda_decode` (amd/kda.py:394-419: a plain decode step only, never with
MTP, and only where the kernel supports the layer: bf16, head 128, conv width 4, gfx942/gfx950). No ROCm mode
is stock (`STOCK_MODES`: a stock mode sets nothing); under the default settings, AITER off (aiter_mla off) and
MTP at K = 3 (draft_length off), stock runs what off runs: the two norms, and no plain decode step.
"""

from __future__ import annotations

from typing import Any

from opts.fusion import naive, passes
from opts.fusion.config import MECHANISMS, FusionConfig
from opts.fusion.in_vllm import rocm_normalize_q_kv, route_plain_decode, unsupported
from opts.vllm_setting import K3_VLLM, KDA_FORWARD, Patch, VllmSetting, check_platform

NAME = "fusion"
STOCK_MODES = {"cuda": "on"}

MLA_NORM_TARGET = f"{K3_VLLM}.mla:fused_q_kv_rmsnorm"
KDA_FORWARD_TARGET = KDA_FORWARD
KDA_FUSED_TARGET = f"{passes.__name__}:kda_decode_slots_fused"
KDA_UNFUSED_TARGET = f"{naive.__name__}:kda_decode_slots_unfused"
MLA_COUNTER = "fusion_mla_norm_fused"
KDA_COUNTER = "fusion_kda_decode_fused"
MLA_UNFUSED_COUNTER = "fusion_mla_norm_unfused"
KDA_UNFUSED_COUNTER = "fusion_kda_decode_unfused"

ROCM_MLA_NORM_TARGET = "vllm.models.kimi_k3.amd.mla:KimiK3MultiHeadLatentAttentionWrapper._normalize_q_kv"
ROCM_KDA_SUPPORTED_TARGET = "vllm.models.kimi_k3.amd.kda:is_fused_kda_decode_supported"
ROCM_KDA_FUSED_TARGET = "vllm._custom_ops:fused_kda_decode"
# what the ROCm patches run, vLLM 0.32 file:line (README.md, "The toggle inside vLLM")
ROCM_RUNS = {
    ("mla_norm", True): "AITER's fused dual RMSNorm, torch.ops.vllm.fused_mla_dual_rms_norm (amd/mla.py:81-88), "
                        "with AITER on or off and under torch.compile too",
    ("mla_norm", False): "the two RMSNorm layers, q_a_layernorm(q_c), kv_a_layernorm(kv_c) (amd/mla.py:90)",
    ("kda_decode", True): "vLLM's own choice of the fused conv + recurrence + gated-norm kernel "
                          "(is_fused_kda_decode_supported, amd/kda.py:188-196; run at amd/kda.py:394-419), counted",
    ("kda_decode", False): "no fused decode kernel: is_fused_kda_decode_supported answers no (amd/kda.py:188-196), "
                           "so a plain decode step runs the conv update, recurrence and gated norm (amd/kda.py:423-)",
}


def _put(new: Any) -> Any:
    return lambda _stock: new


def _same(value: Any) -> Any:
    return value


# fused? -> (replacement, counter, what it runs)
NORM_PASSES = {
    False: (naive.q_kv_rms_norm, MLA_UNFUSED_COUNTER, "two compiled passes (naive.q_kv_rms_norm, vLLM's RMSNorm math)"),
    True: (passes.q_kv_rms_norm_fused, MLA_COUNTER, "one compiled pass (passes.q_kv_rms_norm_fused, vLLM's fused "
           "kernel's math)"),
}
# fused? -> (the pass's attribute, counted there; counter; what it runs)
DECODE_PASSES = {
    False: (KDA_UNFUSED_TARGET, KDA_UNFUSED_COUNTER, "three compiled passes with vLLM's tensors and copies between "
            "them (naive.kda_decode_slots_unfused)"),
    True: (KDA_FUSED_TARGET, KDA_COUNTER, "one compiled pass (passes.kda_decode_slots_fused, as vLLM's "
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


def rocm_patches(mechanism: str, fused: bool) -> tuple[Patch, ...]:
    """The ROCm patches that run `mechanism` fused or unfused (`ROCM_RUNS` says what each runs)."""
    mode, runs = ("on" if fused else "off"), ROCM_RUNS[mechanism, fused]
    if mechanism == "mla_norm":
        return (Patch(ROCM_MLA_NORM_TARGET, lambda _stock: rocm_normalize_q_kv(fused), f"fusion {mode}: the q/kv "
                      f"RMSNorms as {runs}", MLA_COUNTER if fused else MLA_UNFUSED_COUNTER),)
    if not fused:
        return (Patch(ROCM_KDA_SUPPORTED_TARGET, _put(unsupported), f"fusion {mode}: the KDA decode as {runs}"),)
    return (Patch(ROCM_KDA_FUSED_TARGET, _same, f"fusion {mode}: the KDA decode as {runs}", KDA_COUNTER,
                  idle_with=(("speculative_config", SPECULATING),)),)


def vllm_setting(config: FusionConfig, platform: str) -> VllmSetting:
    """What `config` changes in vLLM on `platform`: each mechanism runs fused or unfused as `config` says."""
    check_platform(platform)
    if not isinstance(config, FusionConfig):
        raise TypeError(f"fusion vllm_setting: expected a FusionConfig, got {type(config).__name__}")
    if platform == "cpu":
        return VllmSetting(patches=tuple(p for m in MECHANISMS for p in cpu_patches(m, config.is_fused(m))))
    if platform == "rocm":
        return VllmSetting(patches=tuple(p for m in MECHANISMS for p in rocm_patches(m, config.is_fused(m))))
    unfused = [m for m in MECHANISMS if not config.is_fused(m)]
    new, counter, runs = NORM_PASSES[False]
    patches = (Patch(MLA_NORM_TARGET, _put(new), f"fusion off: the q/kv RMSNorms as {runs} instead of vLLM's Triton "
                     "fused_q_kv_rmsnorm (nvidia/mla.py:521): a counterfactual, vLLM 0.32 has no unfused path",
                     counter),) if "mla_norm" in unfused else ()
    return VllmSetting(patches=patches,
                       additional_config={"kda_decode_backend": "triton"} if "kda_decode" in unfused else {})
