"""cache_retention's bench cases: hit rates, not times. Each case sweeps a scenario over capacities for every
policy (`bench/sweep.py`); its `ratio` is on's hit rate over off's (the smallest over the feasible capacities)."""

from __future__ import annotations

from dataclasses import dataclass

from opts.cache_retention.bench.sweep import (
    FRACTIONS,
    POLICIES,
    SCENARIO_GROUP,
    Scenario,
    check_fractions,
    check_policies,
    scenarios,
)


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


def bench_cases(quick: bool, device: str) -> list[HitRateCase]:
    """The hit-rate cases: every installed scenario of the full bench, or (quick) those of the quick bench
    (named quick_<scenario>). The model runs on the CPU whatever `device` is."""
    found = [s for s in scenarios().values() if (s.quick if quick else s.full)]
    if not found:
        raise ValueError(f"cache_retention: no {'quick' if quick else 'full'} bench scenario is installed (entry-point "
                         f"group {SCENARIO_GROUP}; k3-ablate's workload registers them: pip install -e .)")
    return [HitRateCase(f"quick_{s.name}" if quick else s.name, s) for s in found]
