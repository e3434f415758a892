"""cache_retention's bench cases: hit rates, not times. Each case sweeps a scenario over capacities for every
policy (`sweep.py`); its `ratio` is on's hit rate over off's (the smallest over the feasible capacities)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from opts.cache_retention.geometry import K3_TP8
from opts.cache_retention.sweep import (
    FRACTIONS,
    POLICIES,
    SCENARIOS,
    TRACES,
    Scenario,
    check_fractions,
    check_policies,
    file_stream,
)

QUICK_CONVERSATION_REQUESTS = 1000


@dataclass(frozen=True)
class HitRateCase:
    """One hit-rate case: `scenario` swept over `fractions` of its working set for `policies`."""

    name: str
    scenario: Scenario
    fractions: tuple[float, ...] = FRACTIONS
    policies: tuple[str, ...] = POLICIES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"HitRateCase.name: invalid value {self.name!r}; valid: a non-empty string")
        if not isinstance(self.scenario, Scenario):
            raise ValueError(f"HitRateCase {self.name!r}: scenario: {self.scenario!r} is not a Scenario")
        object.__setattr__(self, "fractions", check_fractions(self.fractions))
        object.__setattr__(self, "policies", check_policies(self.policies))


def quick_conversation() -> Scenario:
    """The first QUICK_CONVERSATION_REQUESTS requests of Mooncake's conversation trace, at K3_TP8."""
    name = f"mooncake_conversation_{QUICK_CONVERSATION_REQUESTS}"
    build = partial(file_stream, f"{TRACES}/conversation_trace.jsonl.gz", QUICK_CONVERSATION_REQUESTS)
    return Scenario(name, build, K3_TP8)


def bench_cases(quick: bool, device: str) -> list[HitRateCase]:
    """The hit-rate cases: every built-in scenario, or (quick) agentx_small and a cut of the conversation trace.
    The model runs on the CPU whatever `device` is."""
    if quick:
        return [HitRateCase("quick_agentx_small", SCENARIOS["agentx_small"]),
                HitRateCase(f"quick_{quick_conversation().name}", quick_conversation())]
    return [HitRateCase(name, scenario) for name, scenario in SCENARIOS.items()]
