"""The simulator's step cost: FLOPs and bytes per rank of one engine step of full-size Kimi K3, per layer type,
from the real shapes in `opts.k3.K3` and the dtypes of `SimModel`; README.md writes the formulas out.

A step is a list of `Seq`s (each request's new tokens and the context before them, and whether they are a prefill
chunk, a decode token or a verification of drafts). `step_costs` gives one `Cost` per kernel class, per rank under
`Parallel` (attention and dense layers tensor parallel over `tp` ranks; routed experts over `tp` ranks by expert
(EP) or by intermediate slice (TP)); `kernel_time` turns a Cost into seconds on a roofline. Efficiencies, launch
costs and overheads are the hardware profile's, never this module's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ablations.backends.sim.config import MOE_SPLITS, MXFP4_BYTES
from ablations.hardware import PRECISIONS
from opts.k3 import K3, K3Spec
from opts.sim_setting import StagePricing, StageTraffic

KINDS = ("prefill", "decode", "verify")


@dataclass(frozen=True)
class SimModel:
    """K3's shapes (`spec`), the sizes its spec does not give (each assumed, from Kimi K2's published config:
    README.md), the bytes per element of each tensor class, and the precision the GEMMs (attention, dense and
    shared-expert weights) and the routed experts compute in (`gemm_precision`, `expert_precision`: bf16, fp8 or
    fp4; MXFP4 experts dequantized to BF16 compute in bf16). `backend.weights` / `backend.experts` set both from a
    weight format (`config.WEIGHT_FORMATS`)."""

    spec: K3Spec = K3
    vocab_size: int = 163840            # assumed (Kimi K2)
    dense_intermediate: int = 18432     # assumed (Kimi K2's dense layer)
    num_dense_layers: int = 1           # layer 1 a dense FFN (DESIGN.md)
    kda_chunk: int = 64                 # the chunked KDA prefill's chunk (fla / vLLM's kernels)
    weight_bytes: float = 2.0           # bf16 attention, dense and shared-expert weights (assumed)
    expert_bytes: float = MXFP4_BYTES   # MXFP4 routed experts
    kv_bytes: float = 2.0               # bf16 latent cache; 1.0 for fp8
    state_bytes: float = 4.0            # fp32 KDA recurrent state
    routing_skew: float = 0.0           # assumed: uniform routing (backend.routing_skew)
    conv_bytes: float = 2.0             # the short conv's state, in the model dtype
    act_bytes: float = 2.0              # bf16 activations
    gemm_precision: str = "bf16"
    expert_precision: str = "bf16"
    embed_bytes: float | None = None    # the embedding and LM head (None: weight_bytes; DeepSeek-R1's stay bf16)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dense_intermediate", "kda_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SimModel.{name}: invalid value {value!r}; valid: an integer >= 1")
        if not 0 <= self.num_dense_layers < self.spec.num_layers:
            raise ValueError(f"SimModel.num_dense_layers: invalid value {self.num_dense_layers!r}; valid: 0.."
                             f"{self.spec.num_layers - 1}")
        if self.embed_bytes is not None and not self.embed_bytes > 0:
            raise ValueError(f"SimModel.embed_bytes: invalid value {self.embed_bytes!r}; valid: bytes > 0 or None")
        for name in ("weight_bytes", "expert_bytes", "kv_bytes", "state_bytes", "conv_bytes", "act_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SimModel.{name}: invalid value {getattr(self, name)!r}; valid: bytes > 0")
        for name in ("gemm_precision", "expert_precision"):
            if getattr(self, name) not in PRECISIONS:
                raise ValueError(f"SimModel.{name}: invalid value {getattr(self, name)!r}; valid choices: "
                                 f"{', '.join(PRECISIONS)}")

    @property
    def precisions(self) -> dict[str, str]:
        """The precision each kernel class computes in (the classes not named: bf16)."""
        return {"gemm": self.gemm_precision, "moe": self.expert_precision}

    @property
    def head_bytes(self) -> float:
        """Bytes per weight of the embedding and the LM head."""
        return self.weight_bytes if self.embed_bytes is None else self.embed_bytes

    @property
    def num_moe_layers(self) -> int:
        return self.spec.num_layers - self.num_dense_layers


@dataclass(frozen=True)
class Parallel:
    """`tp` ranks; attention heads, dense and shared-expert layers split over them; routed experts split by
    expert (`moe="ep"`, each rank holds 1/tp of the experts) or by intermediate slice (`moe="tp"`)."""

    tp: int = 8
    moe: str = "ep"

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"Parallel.tp: invalid value {self.tp!r}; valid: an integer >= 1")
        if self.moe not in MOE_SPLITS:
            raise ValueError(f"Parallel.moe: invalid value {self.moe!r}; valid choices: {', '.join(MOE_SPLITS)}")


@dataclass(frozen=True)
class Mechanisms:
    """What the toggles change in a step's costs (from their `SimSetting`s): `packed_kda`, a step's verification
    rows in its prefill's chunked KDA pass (kda_overlap on, `packed`); `sharded_latent_up`, each rank up-projecting
    only its 1/tp of the hidden size from the latent MoE's output, holding only those rows (moe_dedup on), or
    `latent_up_tier`, doing so only in a MoE pass of more than that many tokens, holding every row (tiered);
    `sequence_parallel_moe`, the MoE layer over 1/tp of the tokens a rank behind all-gathers (moe_dedup sp);
    `fused_kda_decode` and `fused_mla_norm`, the pricing of those stages as one kernel each (fusion on, its
    traffic accounting; None: stock vLLM's separate passes, `stock_kda_decode` / `stock_mla_norm`; the KDA decode
    only in a step that prefills nothing, and never with speculation configured: the caller's rule); `kda_streams`, a
    step's recurrent (verification) and chunked (prefill) KDA passes at once on two streams, one pass of both
    costs ("kda_streams", sharing the node's compute and bandwidth) instead of two one after the other
    (kda_overlap streams)."""

    packed_kda: bool = False
    sharded_latent_up: bool = False
    latent_up_tier: int | None = None
    sequence_parallel_moe: bool = False
    fused_kda_decode: StagePricing | None = None
    fused_mla_norm: StagePricing | None = None
    kda_streams: bool = False


STOCK = Mechanisms()      # every toggle's mechanism off


@dataclass(frozen=True)
class Seq:
    """One request's part of a step: `new_tokens` computed now after `context` cached tokens; `kind` prefill
    (a chunk), decode (one token) or verify (the last token and K drafts: K + 1 tokens)."""

    new_tokens: int
    context: int
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Seq.kind: invalid value {self.kind!r}; valid choices: {', '.join(KINDS)}")
        if self.new_tokens < 1 or self.context < 0:
            raise ValueError(f"Seq: new_tokens {self.new_tokens} must be >= 1 and context {self.context} >= 0")
        if self.kind == "decode" and self.new_tokens != 1:
            raise ValueError(f"Seq: a decode computes 1 token, got {self.new_tokens}")


@dataclass
class Cost:
    """Per rank: FLOPs, bytes moved from memory by kind (weights, cache: KV and KDA state, activations),
    kernel launches, the all-reduces (`collectives`, each of the same payload within one cost name, `comm_bytes`
    in all) and the all-gathers and reduce-scatters (`gathers`, `gather_bytes` in all: each op's whole gathered
    or scattered tensor)."""

    flops: float = 0.0
    weight_bytes: float = 0.0
    cache_bytes: float = 0.0
    act_bytes: float = 0.0
    kernels: int = 0
    comm_bytes: float = 0.0
    collectives: float = 0.0
    gather_bytes: float = 0.0
    gathers: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.cache_bytes + self.act_bytes

    @classmethod
    def total(cls, costs: Iterable[Cost]) -> Cost:
        """The sum of `costs`."""
        out = cls()
        for cost in costs:
            out.add(cost)
        return out

    def add(self, other: Cost, times: float = 1.0) -> None:
        self.flops += other.flops * times
        self.weight_bytes += other.weight_bytes * times
        self.cache_bytes += other.cache_bytes * times
        self.act_bytes += other.act_bytes * times
        self.kernels += int(other.kernels * times)
        self.comm_bytes += other.comm_bytes * times
        self.collectives += other.collectives * times
        self.gather_bytes += other.gather_bytes * times
        self.gathers += other.gathers * times


def gemm(tokens: int, k: int, n: int, weight_bytes: float, act_bytes: float, kernels: int = 1) -> Cost:
    """tokens x [k, n]: 2·tokens·k·n FLOPs; the weights read once, the input and output activations once."""
    return Cost(flops=2.0 * tokens * k * n, weight_bytes=k * n * weight_bytes,
                act_bytes=tokens * (k + n) * act_bytes, kernels=kernels)


def swiglu(m: SimModel, tokens: int, intermediate: int) -> Cost:
    """A SwiGLU MLP on the hidden state: gate and up (hidden -> 2·intermediate), down (intermediate -> hidden)."""
    return Cost.total((gemm(tokens, m.spec.hidden, 2 * intermediate, m.weight_bytes, m.act_bytes),
                       gemm(tokens, intermediate, m.spec.hidden, m.weight_bytes, m.act_bytes)))


def lm_head(m: SimModel, p: Parallel, tokens: int) -> Cost:
    """The LM head (hidden -> vocabulary / tp) for `tokens` tokens."""
    return gemm(tokens, m.spec.hidden, _split(m.vocab_size, p.tp, "vocab_size"), m.head_bytes, m.act_bytes)


def _split(total: int, tp: int, name: str) -> int:
    if total % tp:
        raise ValueError(f"Parallel.tp: invalid value {tp}; valid: a divisor of {name} ({total})")
    return total // tp


SLOT_BYTES = 4       # vLLM's int32 slot indices


def stock_kda_decode(num_tokens: int, num_heads: int, head_dim: int, conv_width: int,
                     act_bytes: float) -> StageTraffic:
    """vLLM's KDA decode of `num_tokens` one-token requests on a rank holding `num_heads` heads as separate passes:
    the conv update, the recurrent update, a copy of its output, the gated RMSNorm, a copy of its output. Each pass
    streams its inputs and outputs once and writes its new state rows to their slots itself; fp32 states, the conv
    window in the activations' dtype."""
    n, es = num_tokens, act_bytes
    hd = num_heads * head_dim
    channels, rows = 3 * hd, n * hd                         # conv channels (q, k, v); the output's elements
    state = n * hd * head_dim * 4
    window = n * channels * (conv_width - 1) * es
    slots = n * SLOT_BYTES
    conv = 2 * n * channels * es + 2 * window + channels * conv_width * es + slots   # x, window in and out; weights
    recurrence = (n * channels * es + rows * es + n * num_heads * es + 4 * num_heads + 4 * hd   # q k v, g, beta, A, dt
                  + 2 * state + slots + rows * es)                                  # state in and out; o out
    copy = 2 * rows * es
    norm = 3 * rows * es + head_dim * es                    # o and gate in, out; weight
    return StageTraffic(5, float(conv + recurrence + 2 * copy + norm))


def stock_mla_norm(num_tokens: int, q_lora_rank: int, kv_lora_rank: int, act_bytes: float) -> StageTraffic:
    """vLLM's RMSNorms of the MLA q and kv latents over `num_tokens` tokens: one pass each, reading its latent and
    weight, writing a new tensor."""
    latent = q_lora_rank + kv_lora_rank
    return StageTraffic(2, float(2 * num_tokens * latent * act_bytes + latent * act_bytes))


def kda_layer(m: SimModel, p: Parallel, seqs: list[Seq], mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """One KDA layer per rank: its projections (in_proj q, k, v, output gate, f_a, beta; f_b; o_proj), the
    short conv and the recurrence (chunked for prefill, token by token for decode and verify). The decode rows'
    conv, recurrence and gated norm run as `mech.fused_kda_decode` prices its fused kernel in a step that prefills
    nothing, else as vLLM's separate passes (`stock_kda_decode`)."""
    s, t = m.spec, p.tp
    d, heads = s.kda_head_dim, _split(s.kda_heads, t, "kda_heads")
    proj = heads * d                                    # P / tp
    tokens = sum(q.new_tokens for q in seqs)
    in_proj = gemm(tokens, s.hidden, 4 * proj + d + heads, m.weight_bytes, m.act_bytes)
    f_b = gemm(tokens, d, proj, m.weight_bytes, m.act_bytes)
    o_proj = gemm(tokens, proj, s.hidden, m.weight_bytes, m.act_bytes)
    gemms = Cost.total((in_proj, f_b, o_proj))
    gemms.comm_bytes, gemms.collectives = tokens * s.hidden * m.act_bytes, 1     # o_proj's all-reduce
    prefill, recurrent = Cost(), Cost()
    state = heads * d * d * m.state_bytes                        # one request's recurrent state on this rank
    decodes = [q for q in seqs if q.kind == "decode"]
    for q in seqs:
        if q.kind == "decode":
            continue
        conv_rows = s.conv_width - 1 + (q.new_tokens - 1 if q.kind == "verify" else 0)
        conv = conv_rows * 3 * proj * m.conv_bytes
        conv_flops = 2.0 * q.new_tokens * 3 * proj * s.conv_width
        io = q.new_tokens * 4 * proj * m.act_bytes               # q, k, v, g in; o out (counted with o_proj)
        if q.kind == "prefill":
            flops = q.new_tokens * heads * (4.0 * d * d + 3.0 * m.kda_chunk * d)
            target = prefill
        else:
            flops = q.new_tokens * heads * 7.0 * d * d
            target = recurrent
        target.add(Cost(flops=flops + conv_flops, cache_bytes=2 * state + 2 * conv, act_bytes=io))
    prefill.kernels = 3 if any(q.kind == "prefill" for q in seqs) else 0    # conv, chunk kernel, gated norm
    recurrent.kernels = 3 if any(q.kind == "verify" for q in seqs) else 0
    if decodes:
        if m.state_bytes != 4 or m.conv_bytes != m.act_bytes:
            raise ValueError(f"SimModel: the KDA decode's traffic has an fp32 state and the conv window in the "
                             f"activations' dtype; got state_bytes {m.state_bytes}, conv_bytes {m.conv_bytes}, "
                             f"act_bytes {m.act_bytes}")
        n = len(decodes)
        pricing = mech.fused_kda_decode if mech.fused_kda_decode and not prefill.kernels else stock_kda_decode
        stage = pricing(n, heads, d, s.conv_width, m.act_bytes)
        cache = n * 2 * (state + (s.conv_width - 1) * 3 * proj * m.conv_bytes)
        flops = n * (heads * 7.0 * d * d + 2.0 * 3 * proj * s.conv_width)
        recurrent.add(Cost(flops=flops, cache_bytes=cache, act_bytes=stage.bytes - cache, kernels=stage.kernels))
    return {"kda_proj": gemms, "kda_prefill": prefill, "kda_recurrent": recurrent}


def mla_layer(m: SimModel, p: Parallel, seqs: list[Seq], mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """One MLA layer per rank: fused q/kv down-projection (replicated), the RMSNorms of its q and kv latents (as
    `mech.fused_mla_norm` prices its one fused pass, else vLLM's two, `stock_mla_norm`), q_b,
    kv_b, output gate (where the spec has one), o_proj; attention over the 576-wide latent cache, which every rank
    keeps whole (prefill: heads expanded; decode and verify: absorbed into the latent)."""
    s, t = m.spec, p.tp
    heads = _split(s.mla_heads, t, "mla_heads")
    qk = s.qk_nope_dim + s.rope_dim
    latent = s.latent_dim
    tokens = sum(q.new_tokens for q in seqs)
    projections = [gemm(tokens, s.hidden, s.q_lora_rank + latent, m.weight_bytes, m.act_bytes),
                   gemm(tokens, s.q_lora_rank, heads * qk, m.weight_bytes, m.act_bytes),
                   gemm(tokens, heads * s.v_head_dim, s.hidden, m.weight_bytes, m.act_bytes)]
    if s.mla_output_gate:
        projections.insert(2, gemm(tokens, s.hidden, heads * s.v_head_dim, m.weight_bytes, m.act_bytes))
    gemms = Cost.total(projections)
    gemms.comm_bytes, gemms.collectives = tokens * s.hidden * m.act_bytes, 1
    stage = (mech.fused_mla_norm or stock_mla_norm)(tokens, s.q_lora_rank, s.kv_lora_rank, m.act_bytes)
    norm = Cost(flops=4.0 * tokens * (s.q_lora_rank + s.kv_lora_rank), act_bytes=stage.bytes, kernels=stage.kernels)
    kv_b = s.kv_lora_rank * heads * (s.qk_nope_dim + s.v_head_dim)
    prefill, decode = Cost(), Cost()
    for q in seqs:
        total = q.context + q.new_tokens
        cache = total * latent * m.kv_bytes + q.new_tokens * latent * m.kv_bytes   # read all, write the new
        keys = q.new_tokens * q.context + q.new_tokens * (q.new_tokens + 1) / 2       # causal (query, key) pairs
        if q.kind == "prefill":
            flops = 2.0 * keys * heads * (qk + s.v_head_dim) + 2.0 * total * kv_b   # scores, AV; kv_b expansion
            expanded = total * heads * (s.qk_nope_dim + s.v_head_dim) * m.act_bytes
            prefill.add(Cost(flops=flops, cache_bytes=cache, act_bytes=expanded))
        else:
            absorb = 2.0 * q.new_tokens * heads * (s.qk_nope_dim * s.kv_lora_rank + s.kv_lora_rank * s.v_head_dim)
            flops = 2.0 * keys * heads * (latent + s.kv_lora_rank) + absorb
            decode.add(Cost(flops=flops, cache_bytes=cache))
    if any(q.kind == "prefill" for q in seqs):
        prefill.weight_bytes = kv_b * m.weight_bytes
        prefill.kernels = 3
    if any(q.kind != "prefill" for q in seqs):
        decode.weight_bytes = kv_b * m.weight_bytes     # the absorbed W_UK and W_UV are kv_b's weights
        decode.kernels = 3
    return {"mla_proj": gemms, "mla_norm": norm, "mla_prefill": prefill, "mla_decode": decode}


def expert_params(s: K3Spec) -> int:
    """Weights of one routed expert: gate and up (its input, the latent or the hidden state -> intermediate) and
    down."""
    return 3 * s.expert_input * s.moe_intermediate


def expected_experts(num_experts: int, top_k: int, tokens: int, skew: float = 0.0) -> float:
    """Experts a step touches when each of `tokens` tokens routes to `top_k` of `num_experts`, independently:
    uniformly (`skew` 0), or expert e (e = 1..E) with probability top_k · p_e per token, p_e ∝ e^-skew (a Zipf
    popularity): sum over e of 1 - (1 - top_k p_e)^tokens."""
    if not skew:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return float(np.sum(1.0 - (1.0 - _pick_rates(num_experts, top_k, skew)) ** tokens))


@functools.cache
def _pick_rates(num_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Each expert's probability of being among a token's `top_k`, top_k · p_e, p_e ∝ e^-skew."""
    share = np.arange(1, num_experts + 1, dtype=float) ** -skew
    rates = top_k * share / share.sum()
    if rates[0] >= 1.0:
        raise ValueError(f"backend.routing_skew: {skew!r} gives the most popular of {num_experts} experts a "
                         f"per-token rate of {rates[0]:.2f} >= 1 at top-{top_k}; valid: a smaller skew")
    return rates


def moe_layer(m: SimModel, p: Parallel, seqs: list[Seq], mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """One latent-MoE layer per rank: router, shared experts (tensor parallel), the replicated latent down and
    up projections (the up one 1/tp per rank with `mech.sharded_latent_up`, or above `mech.latent_up_tier`
    tokens), the routed experts (MXFP4), and the all-reduce of their partial latents. A spec without a latent
    (`expert_latent` 0) is a plain MoE (`_plain_moe_layer`)."""
    s, t = m.spec, p.tp
    tokens = sum(q.new_tokens for q in seqs)
    if not s.expert_latent:
        return _plain_moe_layer(m, p, tokens, mech)
    if mech.sequence_parallel_moe and t > 1:
        if p.moe != "ep":
            raise ValueError(f"Parallel.moe: {p.moe!r} with moe_dedup sp; valid: ep (sp runs each rank's 1/tp of "
                             "the experts whole on every rank's tokens)")
        return _moe_layer_sp(m, t, tokens)
    tier = mech.latent_up_tier
    if tier is not None and tokens > tier:
        mech = replace(mech, sharded_latent_up=True)
    router = gemm(tokens, s.hidden, s.num_experts, m.weight_bytes, m.act_bytes)
    shared_inter = _split(s.moe_intermediate * s.num_shared_experts, t, "shared intermediate")
    shared = swiglu(m, tokens, shared_inter)
    up = _split(s.hidden, t, "hidden") if mech.sharded_latent_up else s.hidden
    latent = Cost.total((gemm(tokens, s.hidden, s.expert_latent, m.weight_bytes, m.act_bytes),
                         gemm(tokens, s.expert_latent, up, m.weight_bytes, m.act_bytes)))
    experts = routed_experts(m, p, tokens)
    experts.comm_bytes, experts.collectives = tokens * s.expert_latent * m.act_bytes, 1
    shared.comm_bytes, shared.collectives = tokens * s.hidden * m.act_bytes, 1
    return {"moe_router": router, "moe_shared": shared, "moe_latent": latent, "moe_experts": experts}


def routed_experts(m: SimModel, p: Parallel, tokens: int) -> Cost:
    """The routed experts of one MoE layer per rank over `tokens` tokens, without their all-reduce. Attention is
    tensor parallel, so every rank holds every token: each computes its share of the routed experts (EP: its 1/tp
    of the experts; TP: a 1/tp slice of every expert), reading the weights of the experts the step touches."""
    s, t = m.spec, p.tp
    per_expert = expert_params(s)
    pairs = tokens * s.experts_per_token
    if p.moe == "ep":
        local = _split(s.num_experts, t, "num_experts")
        touched = expected_experts(s.num_experts, s.experts_per_token, tokens, m.routing_skew) * local / s.num_experts
        weights = touched * per_expert * m.expert_bytes
    else:
        touched = expected_experts(s.num_experts, s.experts_per_token, tokens, m.routing_skew)
        weights = touched * per_expert / t * m.expert_bytes
    return Cost(flops=2.0 * pairs * per_expert / t, weight_bytes=weights,
                act_bytes=pairs / t * 2 * s.expert_input * m.act_bytes, kernels=2)


def _plain_moe_layer(m: SimModel, p: Parallel, tokens: int, mech: Mechanisms) -> dict[str, Cost]:
    """A plain MoE layer per rank (DeepSeek's: the experts on the hidden state): router, shared experts (tensor
    parallel), routed experts, and one all-reduce of their summed partial outputs (vLLM's `DeepseekV2MoE` adds
    the shared output to the routed one before reducing)."""
    if mech.sharded_latent_up or mech.latent_up_tier is not None or mech.sequence_parallel_moe:
        raise ValueError(f"moe_dedup: {m.spec.name} has no latent MoE (expert_latent 0); its mechanisms change the "
                         "latent tail; valid: moe_dedup=off")
    s = m.spec
    router = gemm(tokens, s.hidden, s.num_experts, m.weight_bytes, m.act_bytes)
    shared = swiglu(m, tokens, _split(s.moe_intermediate * s.num_shared_experts, p.tp, "shared intermediate"))
    experts = routed_experts(m, p, tokens)
    experts.comm_bytes, experts.collectives = tokens * s.hidden * m.act_bytes, 1
    return {"moe_router": router, "moe_shared": shared, "moe_experts": experts}


def _moe_layer_sp(m: SimModel, t: int, tokens: int) -> dict[str, Cost]:
    """The MoE layer sequence parallel over `t` ranks (moe_dedup sp, `opts/moe_dedup/sequence.py`): a rank routes,
    down- and up-projects and runs the whole shared MLP on its tokens, T/t (spread evenly: the last rank's zero
    padding is left out, so that the cost stays linear in T), and its 1/t of the experts on all T; the latents are
    all-gathered and the experts' sums reduce-scattered ([T, latent] each), the outputs all-gathered ([T, hidden])."""
    s = m.spec
    own = tokens / t
    router = gemm(own, s.hidden, s.num_experts, m.weight_bytes, m.act_bytes)
    shared = swiglu(m, own, s.moe_intermediate * s.num_shared_experts)
    latent = Cost.total((gemm(own, s.hidden, s.expert_latent, m.weight_bytes, m.act_bytes),
                         gemm(own, s.expert_latent, s.hidden, m.weight_bytes, m.act_bytes)))
    per_expert, pairs = expert_params(s), tokens * s.experts_per_token
    touched = (expected_experts(s.num_experts, s.experts_per_token, tokens, m.routing_skew)
               * _split(s.num_experts, t, "num_experts") / s.num_experts)
    experts = Cost(flops=2.0 * pairs * per_expert / t, weight_bytes=touched * per_expert * m.expert_bytes,
                   act_bytes=pairs / t * 2 * s.expert_latent * m.act_bytes, kernels=2,
                   gather_bytes=2 * tokens * s.expert_latent * m.act_bytes, gathers=2)   # all-gather + reduce-scatter
    latent.gather_bytes, latent.gathers = tokens * s.hidden * m.act_bytes, 1            # the outputs' all-gather
    return {"moe_router": router, "moe_shared": shared, "moe_latent": latent, "moe_experts": experts}


def dense_layer(m: SimModel, p: Parallel, seqs: list[Seq]) -> dict[str, Cost]:
    """The dense FFN (SwiGLU) of layer 1, tensor parallel."""
    tokens = sum(q.new_tokens for q in seqs)
    inter = _split(m.dense_intermediate, p.tp, "dense_intermediate")
    ffn = swiglu(m, tokens, inter)
    ffn.comm_bytes, ffn.collectives = tokens * m.spec.hidden * m.act_bytes, 1
    return {"dense_ffn": ffn}


def attn_res(m: SimModel, seqs: list[Seq], layer: int) -> Cost:
    """The attention-residual mix before layer `layer` (0-based): a weighted sum over the block outputs so far."""
    tokens = sum(q.new_tokens for q in seqs)
    blocks = layer // m.spec.attn_res_block + 1
    return Cost(flops=2.0 * tokens * m.spec.hidden * blocks, act_bytes=tokens * m.spec.hidden * (blocks + 1)
                * m.act_bytes, kernels=1)


def logit_tokens(seqs: list[Seq]) -> int:
    """Tokens that need logits: a prefill chunk's last, a decode token, every verified position."""
    return sum(1 if q.kind in ("prefill", "decode") else q.new_tokens for q in seqs)


def packed(seqs: list[Seq]) -> list[Seq]:
    """The step's parts as KDA runs them when a step that prefills packs its verification rows into the prefill's
    chunked pass (kda_overlap on): each verification as a chunk of its K + 1 tokens."""
    if not any(q.kind == "prefill" for q in seqs):
        return seqs
    return [Seq(q.new_tokens, q.context, "prefill") if q.kind == "verify" else q for q in seqs]


def step_costs(m: SimModel, p: Parallel, seqs: list[Seq], mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """Every kernel class's Cost over the whole model for one step, per rank (the MTP draft passes are the
    engine's: `mtp_costs`), with the toggles' `mech`anisms."""
    if not seqs:
        return {}
    s = m.spec
    tokens = sum(q.new_tokens for q in seqs)
    out: dict[str, Cost] = {}

    def add(costs: dict[str, Cost], times: float = 1.0) -> None:
        for name, cost in costs.items():
            out.setdefault(name, Cost()).add(cost, times)

    if s.num_kda_layers:
        kda = kda_layer(m, p, packed(seqs) if mech.packed_kda else seqs, mech)
        if mech.kda_streams:
            kda["kda_streams"] = Cost.total((kda.pop("kda_prefill"), kda.pop("kda_recurrent")))
        add(kda, s.num_kda_layers)
    add(mla_layer(m, p, seqs, mech), s.num_mla_layers)
    add(moe_layer(m, p, seqs, mech), m.num_moe_layers)
    add(dense_layer(m, p, seqs), m.num_dense_layers)
    if s.attn_res_block:
        mix = Cost()
        for layer in range(s.num_layers):
            mix.add(attn_res(m, seqs, layer))
        out["attn_res"] = mix
    out["embed"] = Cost(act_bytes=tokens * s.hidden * m.act_bytes, weight_bytes=tokens * s.hidden * m.head_bytes,
                        kernels=1)
    out["lm_head"] = lm_head(m, p, logit_tokens(seqs))
    return out


def mtp_costs(m: SimModel, p: Parallel, seqs: list[Seq], mech: Mechanisms = STOCK) -> dict[str, Cost]:
    """One MTP draft pass per rank over `seqs`' tokens: its projection of [embedding; hidden] (2·hidden ->
    hidden), one decoder layer (taken as MLA attention and a latent MoE: assumed, README.md) and the LM head."""
    s = m.spec
    tokens = sum(q.new_tokens for q in seqs)
    out: dict[str, Cost] = {"mtp_proj": gemm(tokens, 2 * s.hidden, s.hidden, m.weight_bytes, m.act_bytes)}
    for costs in (mla_layer(m, p, seqs, mech), moe_layer(m, p, seqs, mech)):
        for name, cost in costs.items():
            out[f"mtp_{name}"] = cost
    out["mtp_lm_head"] = lm_head(m, p, tokens)
    return out


def weights_per_rank(m: SimModel, p: Parallel, mech: Mechanisms = STOCK) -> float:
    """Bytes of weights each rank holds: every layer's, the MTP layer's, the embedding and the LM head."""
    s, t = m.spec, p.tp
    one = [Seq(1, 0, "decode")]
    mech = replace(mech, latent_up_tier=None)             # tiered holds every row of W_up
    kda = kda_layer(m, p, one)["kda_proj"].weight_bytes if s.num_kda_layers else 0.0
    mla = mla_layer(m, p, one)
    attn = mla["mla_proj"].weight_bytes + mla["mla_decode"].weight_bytes
    moe = moe_layer(m, p, one, mech)
    experts = s.num_experts * expert_params(s) * m.expert_bytes / t
    dense = dense_layer(m, p, one)["dense_ffn"].weight_bytes if m.num_dense_layers else 0.0
    non_expert = sum(moe[k].weight_bytes for k in ("moe_router", "moe_shared", "moe_latent") if k in moe)
    vocab = lm_head(m, p, 1).weight_bytes                 # the embedding table holds as much
    mtp = s.mtp_layers * (attn + non_expert + experts + 2 * s.hidden * s.hidden * m.weight_bytes)
    return (s.num_kda_layers * kda + s.num_mla_layers * attn + m.num_moe_layers * (non_expert + experts)
            + m.num_dense_layers * dense + 2 * vocab + mtp)


def kernel_time(cost: Cost, peak_flops: float, bandwidth: float, flops_efficiency: float,
                bandwidth_efficiency: float) -> float:
    """Seconds on a roofline: max(FLOPs / (peak · efficiency), bytes / (bandwidth · efficiency)); peak in FLOP/s,
    bandwidth in bytes/s. Launches, collectives and host overhead are added by the engine."""
    if not (peak_flops > 0 and bandwidth > 0 and 0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
        raise ValueError(f"kernel_time: peak {peak_flops}, bandwidth {bandwidth}, efficiencies {flops_efficiency}, "
                         f"{bandwidth_efficiency}; valid: peak and bandwidth > 0, efficiencies in (0, 1]")
    return max(cost.flops / (peak_flops * flops_efficiency), cost.bytes / (bandwidth * bandwidth_efficiency))
