"""Per-rank work of each mode, part by part, from the shapes: FLOPs, bytes read and written, collective bytes.

A step of T tokens at tensor-parallel size W, hidden H, latent L, E experts (top k, intermediate I), shared MLP
intermediate S, b bytes per element (bf16 as vLLM serves K3: 2; the CPU bench: 4). A collective's `payload` is
the tensor it reduces or gathers; `comm_bytes` what each rank sends (and receives) under the ring algorithm:
all-reduce 2(W-1)/W payload, all-gather and reduce-scatter (W-1)/W payload. Routed-expert counts are
expectations under uniform routing (a token's k experts spread evenly; an expert is read when any token picks it).
At W = 1 vLLM takes no tail tier and runs no collective: every mode counts as off there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from opts.moe_dedup.config import MoeDedupConfig
from opts.moe_dedup.sequence import token_chunk
from opts.moe_dedup.shape import K3_MOE, MoeShape

ELEM_BYTES = 2
IDS_BYTES = 8
SCOPES = ("tail", "layer")


@dataclass(frozen=True)
class PartCount:
    """One part's per-rank work; `duplicated`: every rank computes this same result (the work tensor
    parallelism does not split)."""

    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    payload_bytes: int = 0
    comm_bytes: int = 0
    duplicated: bool = False


@dataclass(frozen=True)
class ModeCount:
    """A mode's per-rank work for one step, by part (in execution order)."""

    mode: str
    effective_mode: str
    scope: str
    tp: int
    num_tokens: int
    elem_bytes: int
    parts: dict[str, PartCount]

    def _sum(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.parts.values())

    @property
    def flops(self) -> int:
        return self._sum("flops")

    @property
    def bytes(self) -> int:
        """Bytes read and written (memory traffic), collectives' buffers excluded."""
        return self._sum("bytes_read") + self._sum("bytes_written")

    @property
    def comm_bytes(self) -> int:
        return self._sum("comm_bytes")

    @property
    def duplicated_flops(self) -> int:
        return sum(p.flops for p in self.parts.values() if p.duplicated)

    def to_dict(self) -> dict[str, object]:
        """Plain data: the totals and every part."""
        return {"mode": self.mode, "effective_mode": self.effective_mode, "scope": self.scope, "tp": self.tp,
                "num_tokens": self.num_tokens, "elem_bytes": self.elem_bytes, "flops": self.flops,
                "bytes": self.bytes, "comm_bytes": self.comm_bytes, "duplicated_flops": self.duplicated_flops,
                "parts": {name: asdict(p) for name, p in self.parts.items()}}


def _collective(kind: str, payload: int, tp: int) -> PartCount:
    share = 2 * (tp - 1) if kind == "all_reduce" else tp - 1
    return PartCount(payload_bytes=payload, comm_bytes=share * payload // tp)


def _gemm(m: int, k: int, n: int, b: int, *, extra_read: int = 0, duplicated: bool = False) -> PartCount:
    """[m, k] x [k, n]: 2mkn FLOPs, reading the [n, k] weight and the input, writing the output."""
    return PartCount(2 * m * k * n, (n * k + m * k) * b + extra_read, m * n * b, duplicated=duplicated)


def _mlp(m: int, hidden: int, inter: int, b: int) -> PartCount:
    """A SiLU-gated MLP on m tokens: three GEMMs (gate, up, down)."""
    return PartCount(6 * m * hidden * inter, (3 * hidden * inter + m * hidden) * b, m * hidden * b)


def _experts(pairs: float, touched: float, latent: int, inter: int, out_rows: int, b: int) -> PartCount:
    """`pairs` (token, expert) products over `touched` experts' weights of intermediate `inter`."""
    return PartCount(round(6 * pairs * latent * inter), round((3 * touched * latent * inter + pairs * latent) * b),
                     out_rows * latent * b)


def _touched(num_experts: int, top_k: int, picks: int) -> float:
    """Expected distinct experts chosen by `picks` tokens, each picking top_k of num_experts uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** picks)


def effective_mode(mode: str, tp: int, num_tokens: int, tier_threshold: int = 256) -> str:
    """What a mode runs for a step: off at tp 1 (vLLM takes no tail tier there), tiered by its threshold."""
    if tp == 1:
        return "off"
    if mode == "tiered":
        return "on" if MoeDedupConfig(mode="tiered", tier_threshold=tier_threshold).is_sharded(num_tokens) else "off"
    return mode


def mode_counts(mode: str | MoeDedupConfig, *, tp: int, num_tokens: int, shape: MoeShape = K3_MOE,
                scope: str = "layer", elem_bytes: int = ELEM_BYTES) -> ModeCount:
    """Per-rank work of `mode` (a mode name or a config: tiered's threshold comes from it) for a step of
    `num_tokens` tokens at tensor-parallel size `tp`; scope "tail" is the part from the expert and shared
    partial outputs to the layer output, "layer" the whole MoE layer."""
    config = mode if isinstance(mode, MoeDedupConfig) else MoeDedupConfig(mode=mode)
    if scope not in SCOPES:
        raise ValueError(f"scope: invalid value {scope!r}; valid choices: {', '.join(SCOPES)}")
    for name, value in (("num_tokens", num_tokens), ("elem_bytes", elem_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: invalid value {value!r}; valid: an integer >= 1")
    shape.check_world_size(tp)
    run = effective_mode(config.mode, tp, num_tokens, config.tier_threshold)
    shape.check_world_size(tp, split_hidden=run == "on", expert_parallel=run == "sp")
    parts = (_sp_parts if run == "sp" else _tp_parts)(run, tp, num_tokens, shape, elem_bytes, scope == "layer")
    return ModeCount(config.mode, run, scope, tp, num_tokens, elem_bytes, parts)


def _tp_parts(run: str, tp: int, t: int, shape: MoeShape, b: int, layer: bool) -> dict[str, PartCount]:
    h, lat, e, k = shape.hidden, shape.latent, shape.num_experts, shape.top_k
    dup = tp > 1
    parts: dict[str, PartCount] = {}
    if layer:
        parts["router"] = _gemm(t, h, e, b, duplicated=dup)
        parts["down"] = _gemm(t, h, lat, b, duplicated=dup)
        parts["experts"] = _experts(t * k, _touched(e, k, t), lat, shape.moe_intermediate // tp, t, b)
        parts["shared"] = _mlp(t, h, shape.shared_intermediate // tp, b)
    if tp > 1:
        parts["latent_all_reduce"] = _collective("all_reduce", t * lat * b, tp)
    parts["norm"] = PartCount(4 * t * lat, (t * lat + lat) * b, t * lat * b, duplicated=dup)
    if run == "on":
        cols = h // tp
        parts["up"] = _gemm(t, lat, cols, b, extra_read=t * cols * b)
        parts["final_all_reduce"] = _collective("all_reduce", t * h * b, tp)
        return parts
    parts["up"] = _gemm(t, lat, h, b, duplicated=dup)
    if tp > 1:
        parts["shared_all_reduce"] = _collective("all_reduce", t * h * b, tp)
    parts["add"] = PartCount(t * h, 2 * t * h * b, t * h * b, duplicated=dup)
    return parts


def _sp_parts(run: str, tp: int, t: int, shape: MoeShape, b: int, layer: bool) -> dict[str, PartCount]:
    h, lat, e, k = shape.hidden, shape.latent, shape.num_experts, shape.top_k
    c = token_chunk(t, tp)
    gathered = c * tp
    parts: dict[str, PartCount] = {}
    if layer:
        parts["router"] = _gemm(c, h, e, b)
        parts["down"] = _gemm(c, h, lat, b)
        parts["dispatch_all_gather"] = _collective("all_gather", gathered * (lat * b + k * (IDS_BYTES + b)), tp)
        local = e // tp
        parts["experts"] = _experts(gathered * k / tp, _touched(e, k, gathered) * local / e, lat,
                                    shape.moe_intermediate, gathered, b)
        parts["shared"] = _mlp(c, h, shape.shared_intermediate, b)
    parts["combine_reduce_scatter"] = _collective("reduce_scatter", gathered * lat * b, tp)
    parts["norm"] = PartCount(4 * c * lat, (c * lat + lat) * b, c * lat * b)
    parts["up"] = _gemm(c, lat, h, b)
    parts["add"] = PartCount(c * h, 2 * c * h * b, c * h * b)
    parts["output_all_gather"] = _collective("all_gather", gathered * h * b, tp)
    return parts
