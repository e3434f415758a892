"""Typed schema of the simulator backend (conf/backend/sim.yaml): parallelism, dtypes, scheduler limits, the
concurrency sweep, the seed. A schema only: it imports nothing of the simulator (the layering test), which reads
its constants from here; the model as the backend serves it is `served.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

MOE_SPLITS = ("ep", "tp")
MXFP4_BYTES = 0.5 + 1 / 32      # a 4-bit value, and one 8-bit scale per 32 values
FP8_BLOCK_BYTES = 1.0 + 4.0 / (128 * 128)     # an 8-bit value, and one fp32 scale per 128 x 128 block (DeepSeek's)
# vLLM's CUDA/HIP graph modes (`graphs.py` prices them)
GRAPH_MODES = ("full_and_piecewise", "full_decode_only", "piecewise", "none")

KV_DTYPES = {"bf16": 2.0, "fp8": 1.0, "fp32": 4.0}
# A weight format: bytes per weight and the precision its GEMM computes in (fp8_block: DeepSeek's FP8 with an fp32
# scale per 128 x 128 block; MXFP4: a 4-bit value and an 8-bit scale per 32; w4a16 dequantizes to BF16 in the
# kernel, w4a8 multiplies MXFP4 by MXFP8 activations).
WEIGHT_FORMATS = {"bf16": (2.0, "bf16"), "fp8": (1.0, "fp8"), "fp8_block": (FP8_BLOCK_BYTES, "fp8"),
                  "mxfp4_w4a16": (MXFP4_BYTES, "bf16"), "mxfp4_w4a8": (MXFP4_BYTES, "fp8"),
                  "mxfp4": (MXFP4_BYTES, "fp4")}
# What `auto` is on each platform: vLLM 0.32's own choice for K3 (README.md, "Memory and precision"; every
# other linear layer of K3 is BF16 on both, `quantization/mxfp4.py:91-106`, the cache "auto" = bf16).
PLATFORM_DEFAULTS = {
    # AITER's A16W4 MoE (`quantization/mxfp4.py:485-501`); FULL_DECODE_ONLY: no K3 module is compiled on ROCm,
    # so prefills run eagerly (`config/compilation.py:1461-1472`)
    "rocm": {"experts": "mxfp4_w4a16", "cudagraph_mode": "full_decode_only"},
    # FlashInfer's TRT-LLM MXFP4 x MXFP8 MoE (`fused_moe/oracle/mxfp4.py:439-449`); K3 a breakable-graph
    # architecture: decode full, prefill piecewise (`config/vllm.py:74-99`)
    "cuda": {"experts": "mxfp4_w4a8", "cudagraph_mode": "full_and_piecewise"},
    "cpu": {"cudagraph_mode": "none"},
}
# A model whose `auto` differs from K3's, by its spec's name: DeepSeek-R1 is served in its checkpoint's own FP8
# (the model's formats), and vLLM compiles its model (`models/deepseek_v2.py:1426`, `@support_torch_compile`), so
# FULL_AND_PIECEWISE stays on ROCm too: decodes replay a full graph, prefills run piecewise.
MODEL_DEFAULTS = {
    "deepseek_r1": {"rocm": {"cudagraph_mode": "full_and_piecewise"},
                    "cuda": {"cudagraph_mode": "full_and_piecewise"}, "cpu": {"cudagraph_mode": "none"}},
}

# The largest routing skew the simulator takes: K3's most popular expert then gets 16 · 0.028 = 0.45 of a token's
# picks, below 1, so each token still picks its 16 distinct experts in expectation (`cost.expected_experts`).
MAX_ROUTING_SKEW = 0.6


@dataclass
class SimBackendConfig:
    """The simulated node runs `model` (the `model` group's name: kimi_k3) at tensor parallelism `tp` (0: every
    device of the `hardware` node), routed experts split by expert (`moe: ep`) or by slice (`tp`), the latent
    cache in `kv_dtype`; vLLM's scheduler limits; the closed-loop `concurrency` sweep (live sessions per point;
    dense where K3 on agentx crosses 50 tok/s/user on an 8-GPU node, between 5 and 8, where its sessions' contexts
    outgrow the cache) and the
    `target_interactivity` (tok/s/user) the headline reads the frontier at; `cache_gb` (0: what the node has left
    after weights and what vLLM keeps back: 1 - `gpu_memory_utilization` of the memory, its default 0.92,
    `config/cache.py:102`, and `non_kv_gb` per rank of activations and graph pools, assumed) sets the prefix cache
    per rank; the weight formats of the attention, dense and
    shared-expert layers (`weights`) and of the routed experts (`experts`: `WEIGHT_FORMATS`) and the cache's
    `kv_dtype` (`auto`: what vLLM serves K3 with on the node's platform, `PLATFORM_DEFAULTS`, else the model's
    own); vLLM's `cudagraph_mode` (auto: the platform's default) and `max_cudagraph_capture_size` (0: vLLM's
    default); `routing_skew` (assumed, 0: uniform) the routed experts' popularity, a Zipf exponent s with expert
    e's share of the routing ∝ e^-s (`cost.expected_experts`; at most 0.6, where the most popular expert's per-token
    probability stays below 1/2 for K3); `seed` draws the accepted drafts; `workers`
    processes run the sweep's points (0: one per core; 1: this process); `bracket_from` (0: every concurrency) runs
    only the points that bracket the target, searching from that concurrency of the list: up while interactivity
    is above the target, down while below (interactivity falls with concurrency; all an attribution of the
    headline needs; the points then run one at a time)."""

    VALIDATOR: ClassVar[str] = "ablations.backends.sim.checks"    # checks an app config for this backend

    name: str = "sim"
    tp: int = 0
    moe: str = "ep"
    kv_dtype: str = "auto"
    weights: str = "auto"
    experts: str = "auto"
    cudagraph_mode: str = "auto"
    max_cudagraph_capture_size: int = 0
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16])
    target_interactivity: float = 50.0
    cache_gb: float = 0.0
    gpu_memory_utilization: float = 0.92
    non_kv_gb: float = 4.0
    routing_skew: float = 0.0
    seed: int = 0
    workers: int = 0
    bracket_from: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"backend.{name}: invalid value {getattr(self, name)!r}; valid: {valid}")

        for name in ("max_num_batched_tokens", "max_num_seqs", "tp", "seed", "workers", "max_cudagraph_capture_size"):
            value = getattr(self, name)
            low = 0 if name in ("tp", "seed", "workers", "max_cudagraph_capture_size") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")
        if self.moe not in MOE_SPLITS:
            raise bad("moe", ", ".join(MOE_SPLITS))
        if self.kv_dtype not in ("auto", *KV_DTYPES):
            raise bad("kv_dtype", ", ".join(("auto", *KV_DTYPES)))
        for name in ("weights", "experts"):
            if getattr(self, name) not in ("auto", *WEIGHT_FORMATS):
                raise bad(name, ", ".join(("auto", *WEIGHT_FORMATS)))
        if self.cudagraph_mode not in ("auto", *GRAPH_MODES):
            raise bad("cudagraph_mode", ", ".join(("auto", *GRAPH_MODES)))
        self.concurrency = list(self.concurrency)
        if not self.concurrency or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                       for c in self.concurrency) or len(set(self.concurrency)) != len(
                                           self.concurrency):
            raise bad("concurrency", "a non-empty list of distinct integers >= 1 (live sessions)")
        if isinstance(self.bracket_from, bool) or not (self.bracket_from == 0 or self.bracket_from in self.concurrency):
            raise bad("bracket_from", f"0 (every point) or one of backend.concurrency {self.concurrency}")
        if isinstance(self.gpu_memory_utilization, bool) or not 0 < self.gpu_memory_utilization <= 1:
            raise bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if isinstance(self.non_kv_gb, bool) or not self.non_kv_gb >= 0:
            raise bad("non_kv_gb", "GB >= 0")
        if isinstance(self.routing_skew, bool) or not 0 <= self.routing_skew <= MAX_ROUTING_SKEW:
            raise bad("routing_skew", f"a Zipf exponent in [0, {MAX_ROUTING_SKEW}] (0: uniform routing)")
        for name in ("target_interactivity", "cache_gb"):
            value = getattr(self, name)
            low_ok = value > 0 if name == "target_interactivity" else value >= 0
            if isinstance(value, bool) or not isinstance(value, int | float) or not (low_ok and math.isfinite(value)):
                raise bad(name, "a number > 0" if name == "target_interactivity" else "GB >= 0 (0: what is left)")


def setting(backend: SimBackendConfig, name: str, platform: str, model: str = "kimi_k3") -> str:
    """The backend's `name` (weights, experts, kv_dtype, cudagraph_mode) with `auto` resolved on `platform` for
    `model` (a spec's name: `MODEL_DEFAULTS`, else K3's `PLATFORM_DEFAULTS`)."""
    value = getattr(backend, name)
    defaults = MODEL_DEFAULTS.get(model, PLATFORM_DEFAULTS)
    return defaults.get(platform, {}).get(name, "auto") if value == "auto" else value
