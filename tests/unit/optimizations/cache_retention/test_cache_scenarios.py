"""cache_retention's sweep scenarios come from the layer above through an entry-point group."""

from __future__ import annotations

import importlib
import re
from importlib.metadata import EntryPoint

import pytest

from opts.cache_retention.cases import bench_cases
from opts.k3.cache.geometry import K3_TP8, TINY

sweep = importlib.import_module("opts.cache_retention.bench.sweep")   # the package exports a function `sweep`


def test_the_workload_hands_down_the_built_in_scenarios() -> None:
    found = sweep.scenarios()
    assert list(found) == ["agentx", "agentx_small", "mooncake_conversation", "mooncake_synthetic",
                           "mooncake_conversation_1000"]
    assert found["agentx_small"].geometry == TINY and found["agentx"].geometry == K3_TP8
    assert [c.name for c in bench_cases(True, "cpu")] == ["quick_agentx_small", "quick_mooncake_conversation_1000"]
    assert [c.name for c in bench_cases(False, "cpu")] == ["agentx", "agentx_small", "mooncake_conversation",
                                                            "mooncake_synthetic"]
    assert len(found["mooncake_conversation_1000"].build().requests) == 1000


def fake_points(monkeypatch, *values: str) -> None:
    points = [EntryPoint(name=f"p{i}", value=v, group=sweep.SCENARIO_GROUP) for i, v in enumerate(values)]
    monkeypatch.setattr(sweep, "entry_points", lambda group: [p for p in points if p.group == group])


def test_a_scenario_provided_twice_names_both_providers(monkeypatch) -> None:
    provider = "ablations.workload.cache_stream:cache_scenarios"
    fake_points(monkeypatch, provider, provider)
    with pytest.raises(ValueError, match=re.escape(f"'agentx' provided by both {provider}")):
        sweep.scenarios()


def test_a_provider_returning_something_else_is_named(monkeypatch) -> None:
    fake_points(monkeypatch, "builtins:dict")
    assert sweep.scenarios() == {}
    fake_points(monkeypatch, "fractions:Fraction")
    monkeypatch.setattr(EntryPoint, "load", lambda self: lambda: {"agentx": "not a scenario"})
    with pytest.raises(ValueError, match="fractions:Fraction: 'agentx' is not a Scenario of that name"):
        sweep.scenarios()


def test_no_provider_is_a_one_line_error(monkeypatch) -> None:
    fake_points(monkeypatch)
    with pytest.raises(ValueError, match=r"no quick bench scenario is installed.*k3_ablate\.cache_scenarios"):
        bench_cases(True, "cpu")
    with pytest.raises(ValueError, match="unknown name 'agentx'; valid choices: none installed"):
        sweep.scenario("agentx")
