"""The Hydra app: every entry point composes and changes exactly what it should; unknown names, bad values and
failed runs give one-line errors and leave no run directory behind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from unittest.mock import ANY

import procs
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

import ablations.run as app_main
from ablations.backends.sim.config import SimBackendConfig
from ablations.backends.vllm.config import VllmBackendConfig
from ablations.config import CONF_DIR, GROUPS, check_overrides, compose_app, group_options, register_configs
from ablations.workload.paths import TRACES
from opts.registry import OPTIMIZATIONS

VLLM_BACKEND = {**{f"backend.{k}": v for k, v in asdict(VllmBackendConfig()).items() if v is not None},
                "backend.max_num_batched_tokens": 64, "backend.enable_prefix_caching": True}
SIM_BACKEND = {f"backend.{k}": v for k, v in asdict(SimBackendConfig()).items()}
MOONCAKE = {"workload.preset": None, "workload.block_size": 512, "workload.schedule": "open"}
# The options whose mandatory value the entry-point test gives (kimi_k3's checkpoint is the user's).
NEEDS = {("model", "kimi_k3"): ["model.checkpoint=/ckpt"]}


def flat(node: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def gpu_node(name: str) -> dict:
    """What a GPU node's hardware option changes: every value its file gives that the default composition (the cpu
    profile) does not, each source as any text; so the schema adds nothing and the composition drops nothing."""
    profile = yaml.safe_load((CONF_DIR / "hardware" / f"{name}.yaml").read_text())
    assert profile.pop("defaults") == ["/hardware_schema@_here_", "_self_"]
    base = flat(asdict(compose_app([])))
    out = {}
    for key, value in flat({"hardware": profile}).items():
        if base.get(key) != value:
            out[key] = ANY if key.startswith("hardware.sources.") else value
    return out


# The assumed figures outside the hardware that conf/experiment/draws.yaml ranges
DRAWN_RANGES = {"ablation.ranges.backend.non_kv_gb": [2.0, 8.0], "ablation.ranges.backend.routing_skew": [0.0, 0.6],
                **{f"ablation.ranges.opts.draft_length.alphas.{i}": [0.7, 0.9] for i in range(8)}}


# What each option of each group changes in the default composition (`python -m ablations` with no overrides).
CHANGES = {
    "design": {
        "_sweep": {},     # only hydra.* (the multirun over the cells, the attribution callback)
        "factorial": {"ablation.design": "factorial"},
        "one_at_a_time": {"ablation.design": "one_at_a_time"},
        "shapley_sampled": {"ablation.design": "shapley_sampled"},
    },
    "experiment": {
        "cpu_small": {"workload.name": "agentx_small", "workload.preset": "agentx_small", "tags": ["cpu_small"]},
        "repeat": {"ablation.repeats": 3},
        "draws": {"ablation.draws": 16, **DRAWN_RANGES,
                  **{k.replace("ablation.ranges.", "ablation.range_reasons."): ANY for k in DRAWN_RANGES}},
        "main": {"ablation.design": "factorial", "ablation.metric": "tput_per_gpu_at_slo", "model.name": "kimi_k3",
                 **gpu_node("mi355x_x8"),
                 **SIM_BACKEND, "backend.workers": 1, "backend.bracket_from": 6},
        "main_vllm_cpu": {"ablation.design": "factorial", "workload.name": "agentx_small",
                          "workload.preset": "agentx_small",
                          "workload.start": "zero", **VLLM_BACKEND, "backend.num_requests": 8,
                          "opts.cache_retention.resume_from": "prompt_tail", "opts.cache_retention.resume_unit": 16},
    },
    "model": {"k3_tiny": {}, "kimi_k3": {"model.name": "kimi_k3", "model.checkpoint": "/ckpt"},
              "deepseek_r1": {"model.name": "deepseek_r1"}},
    "hardware": {
        "cpu": {},
        "mi355x_x8": gpu_node("mi355x_x8"),
        "b300_x8": gpu_node("b300_x8"),
        "h200_x8": gpu_node("h200_x8"),
        "b200_x8": gpu_node("b200_x8"),
    },
    "paths": {"default": {}},
    "backend": {"vllm": VLLM_BACKEND, "sim": SIM_BACKEND},
    "opts/aiter_mla": {"off": {}, "on": {"opts.aiter_mla.mode": "on"}},
    "opts/kda_overlap": {"off": {}, "on": {"opts.kda_overlap.mode": "on"},
                         "streams": {"opts.kda_overlap.mode": "streams"}},
    "opts/fusion": {"off": {}, "on": {"opts.fusion.mode": "on"}},
    "opts/cache_retention": {"off": {}, "on": {"opts.cache_retention.mode": "on"},
                             "evict": {"opts.cache_retention.mode": "evict"},
                             "resume": {"opts.cache_retention.mode": "resume"}},
    "opts/moe_dedup": {"off": {}, "on": {"opts.moe_dedup.mode": "on"},
                       "sequence_parallel": {"opts.moe_dedup.mode": "sp"}, "tiered": {"opts.moe_dedup.mode": "tiered"}},
    "opts/draft_length": {"off": {}, "on": {"opts.draft_length.mode": "on"}, "k0": {"opts.draft_length.mode": "k0"}},
    "workload": {
        "agentx": {},
        "agentx_small": {"workload.name": "agentx_small", "workload.preset": "agentx_small"},
        "mooncake_conversation": {**MOONCAKE, "workload.name": "mooncake_conversation",
                                  "workload.path": f"{TRACES}/conversation_trace.jsonl.gz"},
        "mooncake_synthetic": {**MOONCAKE, "workload.name": "mooncake_synthetic",
                               "workload.path": f"{TRACES}/synthetic_trace.jsonl.gz"},
        **{f"fixed_{name}": {"workload.name": f"fixed_{name}", "workload.preset": None, "workload.start": "zero",
                             "workload.fixed.input_length": isl, "workload.fixed.output_length": osl,
                             "workload.fixed.num_requests": 320}
           for name, isl, osl in (("1k1k", 1024, 1024), ("8k1k", 8192, 1024), ("1k8k", 1024, 8192))},
    },
}
ENTRY_POINTS = [(group, option) for group, options in CHANGES.items() for option in options]


def changes(overrides: list[str]) -> dict:
    base, new = flat(asdict(compose_app([]))), flat(asdict(compose_app(overrides)))
    return {key: new[key] for key in new if new[key] != base.get(key)}


def test_the_default_composition():
    app = compose_app([])
    assert (app.workload.name, app.workload.preset, app.workload.schedule) == ("agentx", "agentx", "closed")
    assert (app.model.name, app.save_trace, app.result_file, app.tags) == ("k3_tiny", False, "result.json", [])
    assert app.backend is None and app.paths.output_root == "outputs"
    assert {name: config.mode for name, config in app.toggles().items()} == dict.fromkeys(OPTIMIZATIONS, "off")


def test_every_option_of_every_group_is_listed_here():
    assert sorted(CHANGES) == sorted(GROUPS)
    for group in GROUPS:
        assert sorted(CHANGES[group]) == group_options(group)


@pytest.mark.parametrize(("group", "option"), ENTRY_POINTS, ids=[f"{g}={o}" for g, o in ENTRY_POINTS])
def test_each_entry_point_changes_exactly_what_it_should(group, option):
    assert changes([f"{group}={option}", *NEEDS.get((group, option), [])]) == CHANGES[group][option]


def test_kimi_k3_without_its_checkpoint_names_the_missing_value(monkeypatch):
    monkeypatch.delenv("K3_CHECKPOINT", raising=False)
    printed = ["model=kimi_k3", "backend=vllm", "hardware=mi355x_x8", "backend.print_commands=true"]
    with pytest.raises(ValueError, match=r"^model\.checkpoint: empty; kimi_k3 is served from its checkpoint"):
        compose_app(printed)
    assert compose_app(["model=kimi_k3", "backend=sim"]).model.checkpoint == ""     # the simulator needs none
    monkeypatch.setenv("K3_CHECKPOINT", "/from/env")
    assert compose_app(["model=kimi_k3"]).model.checkpoint == "/from/env"
    assert compose_app(printed).model.checkpoint == "/from/env"


def test_hydra_lists_the_yaml_files_as_the_options_and_no_schema():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for group in GROUPS:
            assert sorted(loader.get_group_options(group)) == group_options(group)
        with pytest.raises(ConfigCompositionException) as caught:
            compose(config_name="config", overrides=["workload=workload_schema"])
    listed = re.findall(r"^\t(\S+)$", str(caught.value), re.M)
    assert listed == group_options("workload")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("nope=1", "nope: unknown group or field 'nope'; groups: design, experiment, model, workload, "
                   "backend, hardware, paths, opts/aiter_mla, opts/kda_overlap, opts/fusion, opts/cache_retention, "
                   "opts/moe_dedup, opts/draft_length; "
                   "fields: ablation, backend, hardware, model, opts, paths, result_file, save_trace, tags, workload"),
        ("opts/kda=on", "opts/kda: unknown group; groups: design, experiment, model, workload, backend, hardware, "),
        ("opts/kda_overlap=fast", "opts/kda_overlap: unknown option 'fast'; valid options: off, on, streams"),
        ("opts.kda_overlap.chunk=8", "opts.kda_overlap: unknown field(s) chunk; valid fields: chunk_size, mode"),
        ("opts.kda_overlap.chunk_size=33", "opts.kda_overlap: KdaOverlapConfig.chunk_size: invalid value 33"),
        ("opts.fusion.mechanisms=[attn_res]", "opts.fusion: FusionConfig.mechanisms: invalid value(s) 'attn_res'"),
        ("backend=simulator", "backend: unknown option 'simulator'; valid options: sim, vllm"),
        ("backend.max_tokens=4", "backend.max_tokens: no backend is selected (the default is null); valid: add "
                                 "backend=sim or backend=vllm"),
        ("backend=sim backend.max_tokens=4", "backend: unknown field(s) max_tokens; valid fields: bracket_from, "
                                             "cache_gb, concurrency, cudagraph_mode, experts"),
        ("paths.root=x", "paths: unknown field(s) root; valid fields: model_cache, output_root"),
        ("workload=nope", "workload: unknown option 'nope'; valid options: agentx, agentx_small, fixed_1k1k, "
                          "fixed_1k8k, fixed_8k1k, mooncake_conversation, mooncake_synthetic"),
        ("workload=agentx,workload_schema", "workload: unknown option 'workload_schema'; valid options: agentx, "),
        ("experiment=big", "experiment: unknown option 'big'; valid options: cpu_small, draws, main, main_vllm_cpu, "
                           "repeat"),
        ("design=big", "design: unknown option 'big'; valid options: _sweep, factorial, one_at_a_time, "
                       "shapley_sampled"),
        ("model=k3_model_schema", "model: unknown option 'k3_model_schema'; valid options: deepseek_r1, k3_tiny"),
        ("workload.sesions=2", "workload: unknown field(s) sesions; valid fields: block_size, fixed, generator, "
                               "max_live_sessions, name, num_sessions, path, preset, schedule, seed, start, "
                               "time_scale"),
        ("model.hidden=8", "model: unknown field(s) hidden; valid fields: architecture, "),
    ],
)
def test_unknown_groups_options_and_fields_name_the_valid_ones(override, message):
    with pytest.raises(ValueError) as caught:
        compose_app(override.split())
    assert str(caught.value).startswith(message)


def test_known_names_and_hydra_keys_pass_the_check():
    check_overrides(["workload=agentx_small,mooncake_synthetic", "+workload.generator.output={median: 8}",
                     "experiment=null", "~experiment", "hydra.run.dir=x", "hydra/launcher=joblib", "tags=[a]",
                     "experiment=[main,draws]", "hydra/launcher=slurm", "design=factorial"])
    with pytest.raises(ValueError, match=r"^experiment: unknown option 'drawz'; valid options: cpu_small, "):
        check_overrides(["experiment=[main,drawz]"])
    check_overrides(["experiment=main", "backend.seed=1"])           # the experiment selects backend=sim
    with pytest.raises(ValueError, match=r"^backend: unknown field\(s\) sed; valid fields: bracket_from, "):
        check_overrides(["experiment=[main,draws]", "backend.sed=1"])


def test_a_backend_run_is_checked_when_composed():
    with pytest.raises(ValueError, match=r"kda_overlap=streams on cpu: .*valid there: off, on"):
        compose_app(["backend=vllm", "opts/kda_overlap=streams"])
    with pytest.raises(ValueError, match=r"EngineConfig.kv_cache_gib: invalid value 0"):
        compose_app(["backend=vllm", "backend.kv_cache_gib=0"])
    assert compose_app(["opts/kda_overlap=streams"]).toggles()["kda_overlap"].mode == "streams"


def test_typed_schema_rejects_bad_values():
    with pytest.raises(ValueError, match=r"VllmBackendConfig.max_tokens: invalid value 0"):
        compose_app(["backend=vllm", "backend.max_tokens=0"])
    with pytest.raises(ValueError, match=r"WorkloadConfig.schedule: invalid value 'sometimes'"):
        compose_app(["workload.schedule=sometimes"])
    with pytest.raises(ConfigCompositionException, match="num_sessions"):
        compose_app(["workload.num_sessions=not-a-number"])
    with pytest.raises(ValueError, match=r"AppConfig.result_file: '../r.json' is not a plain file name"):
        compose_app(["result_file=../r.json"])


def test_app_run_writes_result(tmp_path):
    result = app_main.run(compose_app(["experiment=cpu_small"]), tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["tags"] == ["cpu_small"]
    assert result["stats"]["requests"] > 0
    assert result["stats"]["theoretical_prefix_reuse"] > 0.96


def run_app(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return procs.run([sys.executable, "-m", "ablations", *args], timeout_s=120, cwd=cwd)


@pytest.mark.spawns
def test_a_run_writes_its_result_and_logs_into_its_run_dir(tmp_path):
    proc = run_app(["experiment=cpu_small"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "prefix reuse" in proc.stdout
    (run_dir,) = (tmp_path / "outputs").glob("*/*")
    assert json.loads((run_dir / "result.json").read_text())["workload"] == "agentx_small"
    log = (run_dir / "__main__.log").read_text()
    assert "[ablations][INFO] - workload agentx_small:" in log
    assert "prefix reuse" in log
    assert f"result: {run_dir / 'result.json'}" in log


@pytest.mark.spawns
def test_help_lists_each_groups_yaml_files(tmp_path):
    proc = run_app(["--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    for group in GROUPS:
        assert f"\n{group}: {', '.join(group_options(group))}\n" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["workload.num_sessions=-1"], "WorkloadConfig.num_sessions: -1 is not an integer >= 1 or null"),
        (["workload=mooncake_synthetic", "workload.path=absent.jsonl"],
         "WorkloadConfig.path: 'absent.jsonl': no such file"),
        (["workload=mooncake_synthetic", "workload.path=cut.jsonl"],
         "cut.jsonl:2: bad JSON: Unterminated string starting at column 2; the file ends mid-line (truncated?)"),
        (["workload=workload_schema"], "workload: unknown option 'workload_schema'; valid options: agentx, "
                                       "agentx_small, fixed_1k1k, fixed_1k8k, fixed_8k1k, mooncake_conversation, "
                                       "mooncake_synthetic"),
        (["workload.sesions=2"], "workload: unknown field(s) sesions; valid fields: block_size, "),
    ],
)
@pytest.mark.spawns
def test_a_bad_value_is_one_line_exit_2_and_leaves_no_run_dir(tmp_path, args, message):
    row = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}
    (tmp_path / "cut.jsonl").write_text(json.dumps(row) + '\n{"timesta')
    proc = run_app(args, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {message}")
    assert proc.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.jsonl"]


@pytest.mark.spawns
def test_a_failed_run_in_an_existing_dir_removes_only_what_it_made(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    proc = run_app(["workload.num_sessions=0", f"hydra.run.dir={keep}"], tmp_path)
    assert proc.returncode == 2
    assert [p.name for p in keep.iterdir()] == ["notes.txt"]
    (keep / "result.json").write_text("an earlier run's")
    proc = run_app(["workload.num_sessions=0", f"hydra.run.dir={keep}"], tmp_path)
    assert proc.returncode == 2
    assert (keep / "result.json").read_text() == "an earlier run's"


def test_the_slurm_launcher_is_submitit_with_its_settings():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=main", "hydra/launcher=slurm"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.timeout_min, launcher.cpus_per_task, launcher.mem_gb) == (20, 1, 4)
    assert cfg.ablation.design == "factorial"      # the preset's design, the launcher apart
