"""How one toggle setting reaches the serving simulator, as data: the record each package's `sim.py` returns.

`sim.py` imports nothing from `ablations`; the simulator (`ablations/backends/sim/`) merges a vector's records into
one (`SimSetting.merged`, field by field) and applies it: it
prices a step with the kernel classes and cost mechanisms the records ask for, runs the prefix cache with their free
order and resume point, and verifies their number of drafts. Nothing in a record says how much faster anything is:
what a record hands the simulator beyond flags (a fused stage's traffic, draft_length's schedule) are the toggle's
own functions of what the simulator asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class StageTraffic:
    """One stage of a step as the simulator prices it: kernels launched and bytes moved."""

    kernels: int
    bytes: float


# A fused stage's pricing, by stage: "kda_decode" (num_tokens, num_heads, head_dim, conv_width, act_bytes) for that
# many one-token requests on a rank holding num_heads heads; "mla_norm" (num_tokens, q_lora_rank, kv_lora_rank,
# act_bytes) for the q and kv latents' RMSNorms over num_tokens tokens.
StagePricing = Callable[..., StageTraffic]
STAGES = ("kda_decode", "mla_norm")


@dataclass(frozen=True)
class SimSetting:
    """What one toggle setting changes in the simulated engine. Empty: the simulator's stock path.

    `kernel_classes`: {cost name: kernel class} for a cost that runs as another kernel class, at that class's
    efficiency in the hardware profile (aiter_mla on: the MLA decode as "attention_vendor"). `packed_kda`: in a
    step that also prefills, the KDA verification rows run inside the prefill's chunked pass (kda_overlap on);
    `kda_streams`: the recurrent and chunked KDA passes run at once on two streams (kda_overlap streams).
    `sharded_latent_up`: each rank up-projects the latent MoE's output into only its 1/tp of the hidden size and
    holds only those weights (moe_dedup on); `latent_up_tier`: that up-projection in a pass of more than this many
    tokens, the replicated one in the others, every rank holding all the weights (moe_dedup tiered);
    `sequence_parallel_moe`: each rank runs the MoE layer's router, projections and shared experts on 1/tp of the
    tokens, its 1/tp of the experts on all of them, behind all-gathers and a reduce-scatter (moe_dedup sp).
    `fused`: {stage: pricing} for stages that run as one fused kernel each (fusion on: "kda_decode", "mla_norm"),
    the fused kernel's kernels and bytes at the sizes the simulator asks for (`StagePricing`; fusion's traffic
    accounting); the simulator prices a stage not listed as stock vLLM's separate passes.
    `free_list`: a factory of the prefix cache's free-block order; `resume`: where a session's next turn resumes
    (cache_retention). `num_drafts` and `alphas`: MTP drafts per verification and their conditional acceptance
    rates (draft_length; None: the simulator's default); with `draft_schedule` (draft_length on) `num_drafts` is
    the largest K, and `draft_schedule(cost)` the [(lo, hi, K), ...] the chooser picks on the simulated node's
    step seconds (`cost.seconds(batch, k)`).
    """

    kernel_classes: dict[str, str] = field(default_factory=dict)
    packed_kda: bool = False
    kda_streams: bool = False
    sharded_latent_up: bool = False
    latent_up_tier: int | None = None
    sequence_parallel_moe: bool = False
    fused: dict[str, StagePricing] = field(default_factory=dict)
    free_list: Callable[[], Any] | None = None
    resume: Any = None
    num_drafts: int | None = None
    alphas: tuple[float, ...] = ()
    draft_schedule: Callable[[Any], tuple[tuple[int, int, int], ...]] | None = None

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.kernel_classes.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise ValueError(f"SimSetting.kernel_classes: names and classes must be strings, got {bad!r}")
        if not isinstance(self.fused, dict) or any(k not in STAGES or not callable(v) for k, v in self.fused.items()):
            raise ValueError(f"SimSetting.fused: invalid value {self.fused!r}; valid: {{stage: pricing}}, stages "
                             f"{', '.join(STAGES)}, each pricing a function returning a StageTraffic")
        if self.num_drafts is not None and (isinstance(self.num_drafts, bool) or not isinstance(self.num_drafts, int)
                                            or self.num_drafts < 0):
            raise ValueError(f"SimSetting.num_drafts: invalid value {self.num_drafts!r}; valid: an integer >= 0")
        object.__setattr__(self, "alphas", tuple(self.alphas))

    @classmethod
    def merged(cls, settings: Iterable[SimSetting]) -> SimSetting:
        """One setting holding what each of `settings` sets, field by field: kernel classes and fused stages
        joined, flags or'd; any other field (the MoE tier, the cache's free order and resume point,
        drafts, their rates and schedule) from the one setting that sets it. Two settings that set such a field,
        or one kernel class, to different values are a ValueError naming the field."""
        settings = list(settings)
        values = {}
        for f in fields(cls):
            default = f.default_factory() if f.default is MISSING else f.default
            given = [getattr(s, f.name) for s in settings if getattr(s, f.name) != default]
            if isinstance(default, dict):
                joined: dict[str, Any] = {}
                for entries in given:
                    for name, value in entries.items():
                        if joined.setdefault(name, value) != value:
                            raise ValueError(f"SimSetting.{f.name}[{name!r}]: set to {joined[name]!r} and "
                                             f"{value!r} by two toggles")
                values[f.name] = joined
            elif isinstance(default, bool):
                values[f.name] = any(given)
            else:
                distinct = [v for i, v in enumerate(given) if v not in given[:i]]
                if len(distinct) > 1:
                    raise ValueError(f"SimSetting.{f.name}: set to {distinct[0]!r} and {distinct[1]!r} by two toggles")
                values[f.name] = distinct[0] if distinct else default
        return cls(**values)


def not_modelled(name: str, mode: str, valid: tuple[str, ...],
                 why: str = "not modelled by the simulator yet") -> ValueError:
    """The error of a toggle setting the simulator cannot run, naming the modes it can."""
    return ValueError(f"opts.{name}: mode {mode!r} is {why}; valid: {', '.join(valid)}")
