"""The `workload` Hydra group: every option composes against the typed schema and loads from any cwd."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from ablations.config import CONF_DIR
from ablations.workload import (
    ClosedLoopSchedule,
    OpenLoopSchedule,
    WorkloadConfig,
    build_schedule,
    load_workload,
    register_configs,
    write_trace,
)

OPTIONS = {"agentx": None, "agentx_small": None, "mooncake_conversation": 12031, "mooncake_synthetic": 3993,
           "fixed_1k1k": None, "fixed_8k1k": None, "fixed_1k8k": None}


@pytest.fixture
def composed():
    register_configs(ConfigStore.instance())
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield lambda *overrides: compose(overrides=list(overrides)).workload


def test_the_group_has_one_option_per_preset_and_real_trace():
    assert sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml")) == sorted(OPTIONS)


def test_the_schema_is_no_option_of_the_group(composed):
    from hydra.core.global_hydra import GlobalHydra

    assert sorted(GlobalHydra.instance().config_loader().get_group_options("workload")) == sorted(OPTIONS)
    with pytest.raises(ConfigCompositionException, match="Could not find 'workload/workload_schema'"):
        composed("+workload=workload_schema")


@pytest.mark.parametrize("name", ["agentx_small", "mooncake_conversation", "mooncake_synthetic", "fixed_1k1k",
                                  "fixed_8k1k", "fixed_1k8k"])
def test_each_option_composes_and_loads_from_another_cwd(composed, name, tmp_path, monkeypatch):
    node = composed(f"+workload={name}")
    config = OmegaConf.to_object(node)
    assert isinstance(config, WorkloadConfig)
    assert config.name == name
    monkeypatch.chdir(tmp_path)
    trace = load_workload(node)
    if OPTIONS[name] is not None:
        assert len(trace.requests) == OPTIONS[name]
        assert isinstance(build_schedule(node, trace), OpenLoopSchedule)
    else:
        assert trace.has_sessions
        assert isinstance(build_schedule(node, trace), ClosedLoopSchedule)


def test_agentx_option_composes(composed):
    config = OmegaConf.to_object(composed("+workload=agentx"))
    assert (config.preset, config.path, config.schedule) == ("agentx", None, "closed")


def test_overrides_reach_the_generator_and_session_count(composed):
    node = composed("+workload=agentx_small", "+workload.generator.max_context_tokens=3500",
                    "+workload.generator.output={median: 10}", "workload.num_sessions=2", "workload.seed=5")
    trace = load_workload(node)
    assert len(trace.root_sessions) == 2
    assert max(r.input_length + r.output_length for r in trace.requests) <= 3500
    config = OmegaConf.to_object(node)
    assert config.generator_config().output.median == 10
    assert config.generator_config().output.sigma == 0.5


def test_bad_values_are_refused(composed):
    with pytest.raises(ValueError, match=r"schedule: invalid value 'later'; valid choices: closed, open"):
        OmegaConf.to_object(composed("+workload=agentx_small", "workload.schedule=later"))
    with pytest.raises(ConfigCompositionException):
        composed("+workload=agentx_small", "workload.seed=abc")
    with pytest.raises(ValueError, match=r"give exactly one of preset, path and fixed .*; a trace file or fixed "
                                         r"lengths need preset null"):
        WorkloadConfig(preset="agentx", path="x.jsonl")
    with pytest.raises(ValueError, match=r"WorkloadConfig.path: 'absent.jsonl': no such file"):
        WorkloadConfig(preset=None, path="absent.jsonl")
    with pytest.raises(ValueError, match=r"WorkloadConfig.path: 'pkg://nope/x': no package named 'nope'"):
        WorkloadConfig(preset=None, path="pkg://nope/x")
    with pytest.raises(ValueError, match=r"WorkloadConfig.path: '/': is a directory"):
        WorkloadConfig(preset=None, path="/")
    with pytest.raises(ValueError, match=r"WorkloadConfig.preset: invalid value 'big'"):
        WorkloadConfig(preset="big")
    with pytest.raises(ValueError, match=r"WorkloadConfig: unknown field\(s\) sesions"):
        load_workload({"preset": "agentx_small", "sesions": 2})
    with pytest.raises(ValueError, match=r"generator.output: unknown field\(s\) mean"):
        load_workload({"preset": "agentx_small", "generator": {"output": {"mean": 3}}})
    node = composed("+workload=mooncake_synthetic", "workload.schedule=closed")
    with pytest.raises(ValueError, match=r"a closed-loop schedule needs sessions"):
        build_schedule(node, load_workload(node))


def test_a_relative_path_is_relative_to_the_working_directory(tmp_path, monkeypatch, small_trace):
    write_trace(small_trace, tmp_path / "t.jsonl.gz")
    monkeypatch.chdir(tmp_path)
    assert load_workload({"preset": None, "path": "t.jsonl.gz"}).requests == small_trace.requests


@pytest.mark.parametrize(("name", "lengths"), [("fixed_1k1k", (1024, 1024)), ("fixed_8k1k", (8192, 1024)),
                                               ("fixed_1k8k", (1024, 8192))])
def test_fixed_lengths_are_one_request_a_session_sharing_nothing(composed, name, lengths):
    trace = load_workload(composed(f"+workload={name}"))
    assert {(r.input_length, r.output_length) for r in trace.requests} == {lengths}
    assert len(trace.sessions) == len(trace.requests) == 320
    ids = [h for r in trace.requests for h in r.hash_ids]
    assert len(ids) == len(set(ids))                 # no block shared: no prefix reuse


def test_fixed_lengths_bad_input_names_the_field():
    with pytest.raises(ValueError, match=r"WorkloadConfig.fixed: FixedLengths.output_length: invalid value 0"):
        WorkloadConfig(preset=None, fixed={"input_length": 8, "output_length": 0, "num_requests": 1})
    with pytest.raises(ValueError, match=r"WorkloadConfig.fixed: missing num_requests"):
        WorkloadConfig(preset=None, fixed={"input_length": 8, "output_length": 8})
    with pytest.raises(ValueError, match=r"WorkloadConfig.fixed: unknown field\(s\) isl"):
        WorkloadConfig(preset=None, fixed={"isl": 8})
    with pytest.raises(ValueError, match="exactly one of preset, path and fixed"):
        WorkloadConfig(fixed={"input_length": 8, "output_length": 8, "num_requests": 1})


def test_a_process_builds_a_workload_once_and_a_changed_trace_file_again(tmp_path, small_trace):
    from ablations.run import workload
    from ablations.workload import trace_stats

    write_trace(small_trace, tmp_path / "t.jsonl.gz")
    cfg = WorkloadConfig(preset=None, path=str(tmp_path / "t.jsonl.gz"))
    first, stats = workload(cfg)
    assert workload(cfg)[0] is first and stats == trace_stats(first)
    stats["requests"] = -1                               # the caller's copy
    assert workload(cfg)[1]["requests"] == len(small_trace.requests)
    write_trace(small_trace.head_sessions(3), cfg.path)
    again, _ = workload(cfg)
    assert again is not first and again.requests == small_trace.head_sessions(3).requests
    generated, _ = workload(WorkloadConfig(preset="agentx_small"))
    assert generated is not again and workload(cfg)[0] is not again     # one kept: read once more
