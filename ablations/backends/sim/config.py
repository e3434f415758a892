"""Typed schema of the simulator backend (conf/backend/sim.yaml): parallelism, dtypes, scheduler limits, the
concurrency sweep, the seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ablations.backends.sim.cost import MOE_SPLITS

KV_DTYPES = {"bf16": 2.0, "fp8": 1.0, "fp32": 4.0}


@dataclass
class SimBackendConfig:
    """The simulated node runs `model` (the `model` group's name: kimi_k3) at tensor parallelism `tp` (0: every
    device of the `hardware` node), routed experts split by expert (`moe: ep`) or by slice (`tp`), the latent
    cache in `kv_dtype`; vLLM's scheduler limits; the closed-loop `concurrency` sweep (live sessions per point;
    dense where K3 on agentx crosses 50 tok/s/user on an 8-GPU node, between 3 and 5) and the
    `target_interactivity` (tok/s/user) the headline reads the frontier at; `cache_gb` (0: what the node has left
    after weights and a 10% reserve) sets the prefix cache per rank; `seed` draws the accepted drafts; `workers`
    processes run the sweep's points (0: one per core; 1: this process); `bracket_from` (0: every concurrency) runs
    only the points that bracket the target, searching from that concurrency of the list: up while interactivity
    is above the target, down while below (interactivity falls with concurrency; all an attribution of the
    headline needs; the points then run one at a time)."""

    name: str = "sim"
    tp: int = 0
    moe: str = "ep"
    kv_dtype: str = "bf16"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 8, 16])
    target_interactivity: float = 50.0
    cache_gb: float = 0.0
    seed: int = 0
    workers: int = 0
    bracket_from: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, valid: str) -> ValueError:
            return ValueError(f"backend.{name}: invalid value {getattr(self, name)!r}; valid: {valid}")

        for name in ("max_num_batched_tokens", "max_num_seqs", "tp", "seed", "workers"):
            value = getattr(self, name)
            low = 0 if name in ("tp", "seed", "workers") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(name, f"an integer >= {low}")
        if self.moe not in MOE_SPLITS:
            raise bad("moe", ", ".join(MOE_SPLITS))
        if self.kv_dtype not in KV_DTYPES:
            raise bad("kv_dtype", ", ".join(KV_DTYPES))
        self.concurrency = list(self.concurrency)
        if not self.concurrency or any(isinstance(c, bool) or not isinstance(c, int) or c < 1
                                       for c in self.concurrency) or len(set(self.concurrency)) != len(
                                           self.concurrency):
            raise bad("concurrency", "a non-empty list of distinct integers >= 1 (live sessions)")
        if isinstance(self.bracket_from, bool) or not (self.bracket_from == 0 or self.bracket_from in self.concurrency):
            raise bad("bracket_from", f"0 (every point) or one of backend.concurrency {self.concurrency}")
        for name in ("target_interactivity", "cache_gb"):
            value = getattr(self, name)
            low_ok = value > 0 if name == "target_interactivity" else value >= 0
            if isinstance(value, bool) or not isinstance(value, int | float) or not (low_ok and math.isfinite(value)):
                raise bad(name, "a number > 0" if name == "target_interactivity" else "GB >= 0 (0: what is left)")
