"""Experiment presets: each design's multirun sweeps exactly its cells, a cell sets its players' modes, and a
sweep interrupted half way resumes without redoing finished cells, a changed toggle field changes a cell's config
hash and a rerun redoes it (the workload-only backend: no engine)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import procs
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ablations.attribution.shapley import factorial, one_at_a_time, permutation_cells, permutations
from ablations.config import CONF_DIR, apply_cell, register_configs, to_app
from ablations.experiment import label, parse_label
from opts.draft_length.acceptance import profile_alphas
from opts.registry import OPTIMIZATIONS

TWO = ["aiter_mla", "fusion"]


def composed(overrides: list[str], hydra: bool = True):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


@pytest.mark.parametrize(("design", "cells"), [
    ("factorial", factorial(OPTIMIZATIONS)),
    ("one_at_a_time", one_at_a_time(OPTIMIZATIONS)),
    ("shapley_sampled", permutation_cells(permutations(tuple(OPTIMIZATIONS), 6, 0))),
])
def test_each_design_sweeps_its_cells_over_every_wired_toggle(design, cells):
    cfg = composed([f"design={design}"])
    swept = cfg.hydra.sweeper.params["ablation.cell"].split(",")
    assert sorted(swept) == sorted(label(c, tuple(OPTIMIZATIONS)) for c in cells) and len(swept) == len(cells)
    assert swept != [label(c, tuple(OPTIMIZATIONS)) for c in cells], "run in a seeded shuffled order"
    assert composed([f"design={design}"]).hydra.sweeper.params["ablation.cell"].split(",") == swept
    assert OmegaConf.to_container(cfg.hydra.sweep)["subdir"] == "${ablation.cell}.r${ablation.repeat}"
    assert cfg.hydra.callbacks.attribute._target_ == "ablations.attribution.sweep.AttributeCallback"


def test_players_and_repeats_come_from_the_config():
    cfg = composed(["design=one_at_a_time", "experiment=repeat", f"ablation.toggles=[{','.join(TWO)}]"])
    assert sorted(cfg.hydra.sweeper.params["ablation.cell"].split(",")) == ["aiter_mla", "aiter_mla+fusion", "all_off",
                                                                            "fusion"]
    assert cfg.hydra.sweeper.params["ablation.repeat"] == "range(0,3)"
    vllm = composed(["design=factorial", "backend=vllm"])
    # cache_retention=on resumes at a turn's end by default, which vLLM cannot; moe_dedup's tail routes are idle
    # at tensor-parallel size 1: neither is wired there
    players = ("aiter_mla", "kda_overlap", "fusion", "draft_length")
    assert "+".join(players) in vllm.hydra.sweeper.params["ablation.cell"].split(",")
    assert len(vllm.hydra.sweeper.params["ablation.cell"].split(",")) == 2 ** len(players)
    wider = composed(["design=factorial", "backend=vllm", "backend.tensor_parallel_size=2",
                      "opts.cache_retention.resume_from=prompt_tail", "opts.cache_retention.resume_unit=16"])
    assert "+".join(OPTIMIZATIONS) in wider.hydra.sweeper.params["ablation.cell"].split(",")


def test_the_main_job_is_the_simulator_factorial_on_every_core():
    cfg = composed(["experiment=main"])
    cells = cfg.hydra.sweeper.params["ablation.cell"].split(",")
    assert len(cells) == 2 ** len(OPTIMIZATIONS) and "+".join(OPTIMIZATIONS) in cells
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher") and cfg.hydra.launcher.n_jobs == -1
    assert cfg.hydra.sweep.dir.endswith("sweeps/factorial/agentx/mi355x_x8")
    # with draws, its own directory: the attribution refuses another experiment's cells beside the plain run's
    assert composed(["experiment=[main,draws]"]).hydra.sweep.dir.endswith("sweeps/factorial_draws/agentx/mi355x_x8")
    app = to_app(apply_cell(composed(["experiment=main", "ablation.cell=all_off"], hydra=False)))
    assert (app.backend.name, app.model.name, app.ablation.metric) == ("sim", "kimi_k3", "tput_per_gpu_at_slo")
    assert app.backend.bracket_from == 6 and app.backend.workers == 1      # the bracket only; the cells take the cores
    b300 = composed(["experiment=main", "hardware=b300_x8"])
    assert b300.hydra.sweep.dir.endswith("sweeps/factorial/agentx/b300_x8")
    assert len(b300.hydra.sweeper.params["ablation.cell"].split(",")) == 2 ** (len(OPTIMIZATIONS) - 1)


def test_a_cell_sets_exactly_its_players_modes():
    cfg = composed(["design=factorial", f"ablation.toggles=[{','.join(TWO)}]", "ablation.cell=fusion",
                    "opts/kda_overlap=on", "+ablation.on.fusion=on", "+ablation.off.aiter_mla=on"], hydra=False)
    app = to_app(apply_cell(cfg))
    modes = {name: config.mode for name, config in app.toggles().items()}
    assert modes == {**dict.fromkeys(OPTIMIZATIONS, "off"), "fusion": "on", "aiter_mla": "on", "kda_overlap": "on"}


def test_a_bad_cell_names_the_players():
    with pytest.raises(ValueError, match=r"'fusion\+nope' names nope; valid: 'all_off' or players joined by '\+' "
                                         r"\(aiter_mla, fusion\)"):
        parse_label("fusion+nope", tuple(TWO))
    with pytest.raises(ValueError, match=r"ablation\.cell: 'fusion' set in a single run"):
        OmegaConf.to_object(composed(["ablation.cell=fusion"], hydra=False))


def multirun_args(sweep_dir: Path, design: str, toggles: list[str], workload: str = "agentx_small") -> list[str]:
    return [sys.executable, "-m", "ablations", "-m", f"design={design}", f"workload={workload}",
            f"ablation.toggles=[{','.join(toggles)}]", "ablation.metric=requests", f"hydra.sweep.dir={sweep_dir}"]


@pytest.mark.spawns
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]],
                         ids=["basic", "joblib"])
def test_a_one_at_a_time_multirun_writes_one_result_per_cell_and_the_attribution(tmp_path, launcher):
    done = procs.run(multirun_args(tmp_path, "one_at_a_time", TWO) + launcher, timeout_s=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert sorted(cells) == ["aiter_mla+fusion.r0", "aiter_mla.r0", "all_off.r0", "fusion.r0"]
    for name, result in cells.items():
        assert result["status"] == "ok" and result["ablation"]["cell"] == name.removesuffix(".r0")
        assert set(result["ablation"]["on"]) == parse_label(name.removesuffix(".r0"), tuple(TWO))
        assert {"cpu_model", "isa", "torch", "commit"} <= set(result["environment"])
    assert len({r["setting_hash"] for r in cells.values()}) == 1
    assert len({r["config_hash"] for r in cells.values()}) == 4
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert {"metric", "all_on", "all_off", "shapley", "interactions"} <= set(out)
    assert out["shapley"] == {"aiter_mla": 0.0, "fusion": 0.0}, "the workload does not depend on the toggles"
    assert "[4/4 cells done]" in done.stdout + done.stderr
    # a quiet terminal: one line per cell with its headline, no launcher line per job; the cell's log has the rest
    terminal = (done.stdout + done.stderr).splitlines()
    per_cell = [line for line in terminal if line.startswith("[cell ")]
    assert len(per_cell) == 4 and all(" (repeat 0): requests " in line for line in per_cell), per_cell
    assert not any(line.startswith("workload ") or "\t#" in line for line in terminal), terminal
    assert "workload agentx_small:" in (tmp_path / "fusion.r0" / "__main__.log").read_text()


@pytest.mark.spawns
def test_the_cluster_example_runs_each_cell_as_a_submitit_job(tmp_path):
    # conf/hydra/launcher/slurm.yaml's settings on submitit's local executor: the jobs Slurm would run, here
    args = [sys.executable, "-m", "ablations", "-m", "experiment=main", "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=20", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=4",
            "ablation.toggles=[fusion]", "workload.num_sessions=2", "backend.concurrency=[1,2]",
            "backend.bracket_from=0", "ablation.metric=total_throughput", f"hydra.sweep.dir={tmp_path}"]
    done = procs.run(args, timeout_s=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert sorted(cells) == ["all_off.r0", "fusion.r0"] and all(c["status"] == "ok" for c in cells.values())
    assert len(list((tmp_path / ".submitit").glob("*/*_submitted.pkl"))) == 2
    assert set(json.loads((tmp_path / "attribution.json").read_text())["shapley"]) == {"fusion"}


@pytest.mark.spawns
def test_an_interrupted_multirun_resumes_without_redoing_finished_cells(tmp_path):
    args = multirun_args(tmp_path, "factorial", ["aiter_mla", "fusion", "kda_overlap"], workload="agentx")
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(list(tmp_path.glob("*/result.json"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the multirun ended before its 2nd cell"
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)     # the whole multirun, at once, as a crash would
        proc.wait(30)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.glob("*/result.json")}
    assert 2 <= len(before) < 8, f"{len(before)} cells finished before the kill: nothing left to resume"
    done = procs.run(args, timeout_s=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.glob("*/result.json")}
    assert len(after) == 8
    assert {p: after[p] for p in before} == before, "a finished cell was run again"
    assert all(json.loads(p.read_text())["status"] == "ok" for p in after)
    assert "finished before, skipped" in done.stdout + done.stderr
    assert json.loads((tmp_path / "attribution.json").read_text())["missing"] == []


# A valid other value for each toggle field (and what it needs beside it); a field missing here fails the test below.
OTHER_VALUE = {
    "mode": None,                         # every other mode of the toggle
    "on_backend": ["vllm_cpu"], "tile_tokens": [64], "stage_bytes": [4096], "chunk_size": [32],
    "mechanisms": [["mla_norm"]], "idle_s": [12.5], "resume_from": ["prompt_tail"],
    "resume_unit": [16, {"resume_from": "prompt_tail"}], "tier_threshold": [512], "k": [4], "max_k": [6],
    "profile": ["decaying"], "alphas": [[0.7, 0.6, 0.5]], "sampling": ["standard"], "schedule": [[[1, 8, 2]]],
    "draft_pass_s": [1e-3], "draft_token_s": [1e-4], "draft_expert_s": [1e-3], "verify_pass_s": [1e-2],
    "verify_token_s": [1e-3], "verify_expert_s": [1e-2], "expert_fraction": [0.25],
}


def _hydra_value(value) -> str:
    return json.dumps(value).replace(" ", "") if isinstance(value, list) else str(value)


def _cell_hash(overrides: dict[str, object], cell: str = "all_off") -> str:
    from ablations.cells import config_hash

    args = ["experiment=main", f"ablation.cell={cell}"] + [f"{k}={_hydra_value(v)}" for k, v in overrides.items()]
    cfg = apply_cell(composed(args, hydra=False))
    to_app(cfg).toggles()       # the changed value is valid: the cell would run with it
    return config_hash(OmegaConf.to_container(cfg, resolve=True))


def _changes():
    from dataclasses import fields

    for name, opt in OPTIMIZATIONS.items():
        for f in fields(opt.config()):
            assert f.name in OTHER_VALUE, f"opts.{name}.{f.name}: add a valid other value to OTHER_VALUE"
            if f.name == "mode":      # a player's mode is the cell's: each of its modes as the cell's "on"
                for mode in type(opt.config()).MODES[1:]:
                    yield name, "mode", mode, {}
                continue
            value, *needs = OTHER_VALUE[f.name]
            yield name, f.name, value, {f"opts.{name}.{k}": v for k, v in (needs[0] if needs else {}).items()}


def test_changing_any_field_of_any_toggle_changes_the_cells_config_hash():
    base = _cell_hash({})
    seen = {}
    for name, field_name, value, needs in _changes():
        before = _cell_hash(needs) if needs else base
        if field_name == "mode":
            after = _cell_hash({f"+ablation.on.{name}": value}, cell=name)
        else:
            after = _cell_hash({**needs, f"opts.{name}.{field_name}": value})
        assert after != before, f"opts.{name}.{field_name}={value!r} leaves the cell's config hash unchanged"
        seen[f"{name}.{field_name}={value}"] = after
    assert len(set(seen.values())) == len(seen), "two different changes gave one hash"
    assert len(seen) >= sum(len(type(o.config()).MODES) - 1 for o in OPTIMIZATIONS.values()) + 20


@pytest.mark.spawns
def test_a_rerun_with_a_changed_toggle_field_redoes_the_cells_instead_of_reusing_them(tmp_path):
    args = multirun_args(tmp_path, "factorial", ["draft_length"])
    first = procs.run(args, timeout_s=300, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: json.loads(p.read_text())["config_hash"] for p in tmp_path.glob("*/result.json")}
    assert len(before) == 2
    changed = procs.run([*args, "opts.draft_length.k=4"], timeout_s=300, cwd=tmp_path)     # a player's field
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert "finished before, skipped" not in changed.stdout + changed.stderr
    after = {p: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert set(after) == set(before)
    assert all(after[p]["config_hash"] != before[p] for p in before), "a cell kept its old result"
    assert all(after[p]["config"]["opts"]["draft_length"]["k"] == 4 for p in after)
    again = procs.run([*args, "opts.draft_length.k=4"], timeout_s=300, cwd=tmp_path)
    assert again.returncode == 0 and (again.stdout + again.stderr).count("finished before, skipped") == 2
    # a field of a toggle that is not a player is another experiment: refused, nothing overwritten
    kept = {p: p.read_bytes() for p in after}
    other = procs.run([*args, "opts.draft_length.k=4", "opts.fusion.mechanisms=[mla_norm]"], timeout_s=300,
                      cwd=tmp_path)
    assert "holds a result of another experiment" in other.stderr, other.stderr[-3000:]
    assert {p: p.read_bytes() for p in kept} == kept


def _draw_config(draw: int, *extra: str):
    cfg = apply_cell(composed(["experiment=[main,draws]", "ablation.cell=all_off", f"ablation.draw={draw}", *extra],
                              hydra=False))
    return OmegaConf.to_container(cfg, resolve=True)


def test_a_draw_sets_the_hardwares_ranged_figures_and_only_the_config_hash_records_it():
    from ablations.attribution.draws import latin_hypercube
    from ablations.cells import config_hash, setting_hash

    point, first, second = _draw_config(-1), _draw_config(0), _draw_config(1)
    ranges = point["hardware"]["ranges"]
    draws = latin_hypercube({**ranges, **point["ablation"]["ranges"]}, 16, 0)
    assert point["ablation"]["drawn"] == {} and set(first["ablation"]["drawn"]) == {*ranges, *point["ablation"][
        "ranges"]}
    for key in ranges:
        value = first["hardware"]["efficiency"][key.split(".")[1]] if key.startswith("efficiency.") \
            else first["hardware"][key]
        assert value == first["ablation"]["drawn"][key] == pytest.approx(draws[0][key]), key
    assert first["backend"]["non_kv_gb"] == first["ablation"]["drawn"]["backend.non_kv_gb"] != point["backend"][
        "non_kv_gb"]
    drawn = first["ablation"]["drawn"]
    assert first["opts"]["draft_length"]["alphas"] == [drawn[f"opts.draft_length.alphas.{i}"] for i in range(8)]
    assert point["opts"]["draft_length"]["alphas"] == []
    assert len({config_hash(c) for c in (point, first, second)}) == 3
    players = list(OPTIMIZATIONS)
    assert len({setting_hash(c, players) for c in (point, first, second)}) == 1
    # a non-drawn hardware figure is still the experiment's: another setting
    other = _draw_config(0, "hardware.bandwidth_tb_s=7.0")
    assert setting_hash(other, players) != setting_hash(first, players)
    assert setting_hash(_draw_config(0, "backend.max_num_seqs=64"), players) != setting_hash(first, players)
    with pytest.raises(ValueError, match=r"ablation\.ranges\.backend\.nope: no such figure in the config"):
        _draw_config(0, "+ablation.ranges={backend.nope:[1.0,2.0]}", "+ablation.range_reasons={backend.nope:x}")
    with pytest.raises(ValueError, match=r"ablation\.ranges\.backend\.max_num_seqs: no reason"):
        to_app(composed(["experiment=[main,draws]", "+ablation.ranges={backend.max_num_seqs:[1.0,2.0]}"], hydra=False))
    with pytest.raises(ValueError, match=r"ablation\.draw: 16 is not in -1\.\.15"):
        to_app(apply_cell(composed(["experiment=[main,draws]", "ablation.cell=all_off", "ablation.draw=16"],
                                   hydra=False)))


def draws_args(sweep_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ablations", "-m", "experiment=[main,draws]", "hydra/launcher=basic",
            "ablation.toggles=[fusion]", "ablation.draws=3", "workload=agentx_small", "backend.concurrency=[1,2]",
            "backend.bracket_from=0", "ablation.metric=total_throughput", f"hydra.sweep.dir={sweep_dir}", *extra]


@pytest.mark.spawns
def test_the_draws_give_each_toggle_an_interval_and_collapsed_ranges_reproduce_the_point(tmp_path):
    done = procs.run(draws_args(tmp_path / "drawn"), timeout_s=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = sorted(p.parent.name for p in (tmp_path / "drawn").glob("*/result.json"))
    assert cells == sorted(f"{c}.r0.d{d}" for c in ("all_off", "fusion") for d in (-1, 0, 1, 2))
    out = json.loads((tmp_path / "drawn" / "attribution.json").read_text())
    draws = out["draws"]
    assert (draws["num"], draws["complete"]) == (3, 3) and out["missing"] == []
    interval = draws["intervals"]["fusion"]
    assert interval["point"] == out["shapley"]["fusion"] and len(interval["values"]) == 3
    assert interval["low"] <= interval["high"] and len(set(interval["values"])) == 3, "the draws move the value"
    assert "over 3 joint draws of the assumed figures" in done.stdout + done.stderr
    figures = set(compose_app_hw().ranges) | set(point_values())
    assert set(draws["figures"]) == {"0", "1", "2"} and set(draws["figures"]["0"]) == figures
    assert set(draws["first_order"]["fusion"]) == figures
    alphas = {json.dumps(json.loads((tmp_path / "drawn" / f"fusion.r0.d{d}" / "result.json").read_text())[
        "config"]["opts"]["draft_length"]["alphas"]) for d in range(3)}
    assert len(alphas) == 3, "each draw sets its own acceptance rates"
    assert "which assumption matters" in done.stdout + done.stderr
    assert (tmp_path / "drawn" / "assumptions.png").stat().st_size > 0
    # every range collapsed to its point value: each draw is the plain run, byte for byte
    hw = compose_app_hw()
    collapsed = "hardware.ranges={" + ",".join(f"{k}:[{hw.value(k)!r},{hw.value(k)!r}]" for k in hw.ranges) + "}"
    others = "ablation.ranges={" + ",".join(f"{k}:[{v!r},{v!r}]" for k, v in point_values().items()) + "}"
    done = procs.run(draws_args(tmp_path / "collapsed", collapsed, others), timeout_s=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "collapsed" / "attribution.json").read_text())
    kept = json.loads((tmp_path / "collapsed" / "fusion.r0.d0" / "result.json").read_text())
    assert all(low == high for low, high in kept["config"]["hardware"]["ranges"].values())
    assert kept["config"]["ablation"]["drawn"] == {**{k: hw.value(k) for k in hw.ranges}, **point_values()}
    assert all(v == out["shapley"] for v in out["draws"]["values"].values())
    for cell in ("all_off", "fusion"):
        point = json.loads((tmp_path / "collapsed" / f"{cell}.r0.d-1" / "result.json").read_text())
        for d in range(3):
            drawn = json.loads((tmp_path / "collapsed" / f"{cell}.r0.d{d}" / "result.json").read_text())
            assert json.dumps(drawn["metrics"]) == json.dumps(point["metrics"])
            assert drawn["points"] == point["points"]


def point_values() -> dict[str, float]:
    """The point value of every figure conf/experiment/draws.yaml ranges outside the hardware."""
    cfg = composed(["experiment=[main,draws]"], hydra=False)
    alphas = profile_alphas(cfg.opts.draft_length.profile, cfg.opts.draft_length.max_k)
    out = {}
    for key in cfg.ablation.ranges:
        parent, _, last = key.rpartition(".")
        out[key] = alphas[int(last)] if parent == "opts.draft_length.alphas" else OmegaConf.select(cfg, key)
    assert len(out) == 10
    return out


def compose_app_hw():
    return to_app(composed(["experiment=main"], hydra=False)).hardware


def test_the_routing_skew_is_the_cells_and_a_draw_sets_it():
    assert _cell_hash({"backend.routing_skew": 0.3}) != _cell_hash({})
    point, first = _draw_config(-1), _draw_config(0)
    assert point["backend"]["routing_skew"] == 0.0
    assert 0.0 <= first["backend"]["routing_skew"] == first["ablation"]["drawn"]["backend.routing_skew"] <= 0.6
    with pytest.raises(ValueError, match=r"backend.routing_skew: invalid value 0.7; valid: a Zipf exponent in "
                                         r"\[0, 0.6\]"):
        to_app(composed(["experiment=main", "backend.routing_skew=0.7"], hydra=False))
