"""The model as the simulator backend serves it on a platform: its weight formats and cache dtype (`served_model`),
and vLLM's graph settings for it (`graphs`)."""

from __future__ import annotations

from dataclasses import replace

from ablations.backends.sim.config import KV_DTYPES, WEIGHT_FORMATS, SimBackendConfig, setting
from ablations.backends.sim.cost import SimModel
from ablations.backends.sim.graphs import Graphs
from ablations.hardware import HardwareConfig


def served_model(backend: SimBackendConfig, model: SimModel, platform: str) -> SimModel:
    """`model` in the weight formats and cache dtype the backend serves it with on `platform` (`auto` where the
    platform has no default: the model's own), routed as `backend.routing_skew` says."""
    out = replace(model, routing_skew=backend.routing_skew) if backend.routing_skew else model
    name = model.spec.name
    kv = setting(backend, "kv_dtype", platform, name)
    if kv != "auto":
        out = replace(out, kv_bytes=KV_DTYPES[kv])
    weights, experts = setting(backend, "weights", platform, name), setting(backend, "experts", platform, name)
    if weights != "auto":
        out = replace(out, weight_bytes=WEIGHT_FORMATS[weights][0], gemm_precision=WEIGHT_FORMATS[weights][1])
    if experts != "auto":
        out = replace(out, expert_bytes=WEIGHT_FORMATS[experts][0], expert_precision=WEIGHT_FORMATS[experts][1])
    return out


def graphs(backend: SimBackendConfig, model: SimModel, hw: HardwareConfig, max_drafts: int) -> Graphs:
    """vLLM's graph settings for the backend on `hw` with `max_drafts` speculative tokens: the mode, the largest
    captured batch (vLLM's default: min(2·max_num_seqs·(1 + K), the device's ceiling, max_num_batched_tokens),
    `config/vllm.py:2292-2550`) and the pieces a piecewise pass replays (its attention layers + 1)."""
    s = model.spec
    largest = backend.max_cudagraph_capture_size or min(2 * backend.max_num_seqs * (1 + max_drafts),
                                                        hw.capture_ceiling, backend.max_num_batched_tokens)
    return Graphs(mode=setting(backend, "cudagraph_mode", hw.platform, s.name), max_tokens=largest,
                  target_pieces=s.num_kda_layers + s.num_mla_layers + 1, mtp_pieces=2)
