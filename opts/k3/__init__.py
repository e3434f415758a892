"""Kimi K3 itself: its dimensions (the tiny model: `tiny.py`) and the math every optimization package and the vLLM
backend share (KDA, norms, the gate; absorbed MLA: `opts.k3.mla`)."""

from __future__ import annotations

from opts.k3.gate import kda_gate
from opts.k3.kda import chunk_kda, recurrent_kda, recurrent_kda_states
from opts.k3.kda_checks import KdaDims, check_cu_seqlens, check_kda_inputs, check_state, compute_dtype
from opts.k3.norms import L2_NORM_EPS, gated_rms_norm, l2_normalize, rms_norm_f64, rms_norm_fp32, rms_norm_native
from opts.k3.spec import K3, TP, K3Spec
from opts.k3.tiny import K3_TINY, TINY_CONFIG, spec_from_config

__all__ = [
    "K3",
    "K3_TINY",
    "L2_NORM_EPS",
    "TINY_CONFIG",
    "TP",
    "K3Spec",
    "KdaDims",
    "check_cu_seqlens",
    "check_kda_inputs",
    "check_state",
    "chunk_kda",
    "compute_dtype",
    "gated_rms_norm",
    "kda_gate",
    "l2_normalize",
    "recurrent_kda",
    "recurrent_kda_states",
    "rms_norm_f64",
    "rms_norm_fp32",
    "rms_norm_native",
    "spec_from_config",
]
