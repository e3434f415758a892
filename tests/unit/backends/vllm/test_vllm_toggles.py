"""How a toggle vector reaches vLLM: the settings as data (stock cells empty, every patch target real), the
engine arguments and environment they make, the plugin's install in a fresh process, and the record it leaves."""

from __future__ import annotations

import json
import sys
import time

import procs
import pytest

from ablations.backends.vllm.__main__ import main, toggle_overrides
from ablations.backends.vllm.in_vllm import counters, patches
from ablations.backends.vllm.in_vllm.patches import same_wrap
from ablations.backends.vllm.in_vllm.toggles import CONFIG_KEY, read_records, toggle_patches
from ablations.backends.vllm.launch.engine import CPU_MLA_BACKEND, EngineConfig, engine_env, engine_kwargs
from opts.registry import OPTIMIZATIONS, parse_vector, vector_dict
from opts.vllm_setting import PLATFORMS, VllmSetting

MODES = [(name, mode) for name, opt in OPTIMIZATIONS.items() for mode in opt.config_cls.MODES]


def wired_cells() -> list[tuple[str, str, str, VllmSetting]]:
    """(name, mode, platform, setting) of every cell vLLM can run."""
    cells = []
    for name, mode in MODES:
        for platform in PLATFORMS:
            try:
                setting = OPTIMIZATIONS[name].vllm_setting(OPTIMIZATIONS[name].config(mode=mode), platform)
            except ValueError as err:
                assert f"{name}={mode} on {platform}" in str(err) and "valid there" in str(err)
                continue
            cells.append((name, mode, platform, setting))
    return cells


def stock_vector(platform: str) -> dict[str, dict[str, str]]:
    return {name: {"mode": opt.stock_modes[platform]} for name, opt in OPTIMIZATIONS.items()
            if platform in opt.stock_modes}


def test_the_stock_mode_of_each_platform_changes_nothing_and_every_other_mode_something():
    for name, mode, platform, setting in wired_cells():
        is_stock = OPTIMIZATIONS[name].stock_modes.get(platform) == mode
        assert setting.is_stock == is_stock, (name, mode, platform, setting)
    for name, opt in OPTIMIZATIONS.items():
        assert set(opt.stock_modes.values()) <= set(opt.config_cls.MODES), name
        assert set(opt.stock_modes) <= set(PLATFORMS), name


def test_every_toggle_patch_target_exists_in_the_installed_vllm(vllm):
    targets = {patch.target for *_, setting in wired_cells() for patch in setting.patches}
    assert targets, "no toggle installs a patch anywhere"
    for target in sorted(targets):
        owner, attr = patches.resolve(target)
        assert hasattr(owner, attr), target


@pytest.mark.parametrize("platform", PLATFORMS)
def test_a_stock_vector_gives_stock_engine_arguments_and_environment(platform):
    vector = stock_vector(platform)
    stock, toggled = EngineConfig(platform=platform), EngineConfig(platform=platform, toggles=vector)
    kwargs = engine_kwargs(toggled)
    assert kwargs.pop("additional_config") == {CONFIG_KEY: toggled.toggles}
    assert kwargs == engine_kwargs(stock)
    assert engine_env(toggled) == engine_env(stock)
    assert toggle_patches(parse_vector(vector), platform) == []


def test_a_non_stock_cell_adds_exactly_its_setting():
    for name, mode, platform, setting in wired_cells():
        if setting.is_stock:
            continue
        cfg = EngineConfig(platform=platform, toggles={name: {"mode": mode}})
        stock = EngineConfig(platform=platform)
        kwargs, base = engine_kwargs(cfg), engine_kwargs(stock)
        extra = kwargs.pop("additional_config")
        assert extra == {**setting.additional_config, CONFIG_KEY: cfg.toggles}
        expected = {**base, **setting.engine_args}
        if platform == "cpu" and "speculative_config" in expected:  # S24: the draft runs CPU_MLA too
            expected["speculative_config"] = {**expected["speculative_config"], "attention_backend": CPU_MLA_BACKEND}
        assert kwargs == expected
        assert engine_env(cfg) == {**engine_env(stock), **setting.env}


def test_bad_vectors_name_the_problem():
    with pytest.raises(ValueError, match=r"EngineConfig.toggles: unknown optimization\(s\) kda; valid choices: "):
        EngineConfig(toggles={"kda": {"mode": "on"}})
    with pytest.raises(ValueError, match=r"EngineConfig.toggles.fusion: expected a mapping of fields"):
        EngineConfig(toggles={"fusion": "on"})
    with pytest.raises(ValueError, match=r"KdaOverlapConfig.mode: invalid value 'fast'"):
        EngineConfig(toggles={"kda_overlap": {"mode": "fast"}})
    with pytest.raises(ValueError, match=r"kda_overlap=streams on cpu: .*; valid there: "):
        EngineConfig(toggles={"kda_overlap": {"mode": "streams"}})
    with pytest.raises(ValueError, match=r"EngineConfig.additional_config: .*set `toggles`"):
        EngineConfig(additional_config={CONFIG_KEY: {}})


def test_toggle_overrides_use_the_apps_spelling():
    assert toggle_overrides(["opts/fusion=on", "opts.kda_overlap.chunk_size=32"]) == {
        "fusion": {"mode": "on"}, "kda_overlap": {"chunk_size": 32}}
    assert main(["patches", "fusion=on"]) == 2


def test_patches_command_lists_the_toggle_patches(capsys):
    name, mode, platform, setting = next(c for c in wired_cells() if c[3].patches)
    assert main(["patches", f"opts/{name}={mode}", "--platform", platform]) == 0
    out = capsys.readouterr().out
    assert f"{len(setting.patches)} from the toggles" in out
    for patch in setting.patches:
        assert patch.target in out and patch.why in out


INSTALL = """
import json, sys
from ablations.backends.vllm.launch.runtime import hide_media_wheels
hide_media_wheels()
from ablations.backends.vllm.in_vllm import plugin
from ablations.backends.vllm.in_vllm import toggles
from ablations.backends.vllm.in_vllm import patches
plugin.register()
before = [p.target for p in patches.installed()]
toggles.install_vector(json.loads(sys.argv[1]), "cpu")
toggles.install_vector(json.loads(sys.argv[1]), "cpu")
after = [p.target for p in patches.installed()]
try:
    toggles.install_vector(json.loads(sys.argv[2]), "cpu")
    switched = "no error"
except RuntimeError as err:
    switched = str(err)
print(json.dumps({"added": [t for t in after if t not in before] if len(after) > len(before) else [],
                  "count": len(after) - len(before), "switched": switched}))
"""


@pytest.mark.spawns
def test_the_plugin_installs_exactly_the_vectors_patches_once_per_process(vllm, tmp_path):
    name, mode, _, setting = next(c for c in wired_cells() if c[2] == "cpu" and c[3].patches)
    vector = {**stock_vector("cpu"), name: {"mode": mode}}
    other = stock_vector("cpu")
    env_path = ":".join(sys.path)
    env = {"PYTHONPATH": env_path, "PATH": "", counters.COUNTER_DIR_ENV: str(tmp_path)}
    proc = procs.run([sys.executable, "-c", INSTALL, json.dumps(vector), json.dumps(other)], timeout_s=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["count"] == len(setting.patches)
    assert "already serves toggle vector" in result["switched"]
    (record,) = read_records(tmp_path)
    assert record["toggles"] == vector_dict(parse_vector(vector))
    assert [p["target"] for p in record["patches"]][-len(setting.patches):] == [p.target for p in setting.patches]


def test_counts_reach_disk_without_a_new_kernel_name(tmp_path, monkeypatch):
    monkeypatch.setenv(counters.COUNTER_DIR_ENV, str(tmp_path))
    name = f"probe_{time.monotonic_ns()}"
    counters.count(name)
    assert counters.read_counts(tmp_path)[name] == 1
    counters.count(name)
    counters.wait_flushed()
    assert counters.read_counts(tmp_path)[name] == 2


def test_a_vector_set_up_twice_gives_the_same_patches():
    """A process that installs its vector twice (worker and scheduler hooks) builds fresh patches each time: the
    patch layer must see them as the ones installed, not as a second patch of the target."""
    for name, mode, platform, setting in wired_cells():
        first, again = (toggle_patches(parse_vector({name: {"mode": mode}}), platform) for _ in range(2))
        assert len(first) == len(again) == len(setting.patches)
        for a, b in zip(first, again, strict=True):
            assert a == b and same_wrap(a.wrap, b.wrap), (name, mode, platform, a.target)
