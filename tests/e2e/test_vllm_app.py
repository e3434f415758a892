"""`python -m ablations backend=vllm ...`: the Hydra app starts the tiny engine with the toggle vector, generates
from the workload's first requests and records the vector, the kernel counts and every process's patches."""

from __future__ import annotations

import json
import sys

import procs
import pytest
from notebook_exec import execute, text_of

from ablations.backends.vllm.in_vllm.cpu.kda import MIXED_STEP_COUNTER
from ablations.backends.vllm.launch.engine import EngineConfig
from opts.cache_retention import vllm as cache_vllm
from opts.fusion import vllm as fusion_vllm
from opts.kda_overlap import vllm as kda_overlap_vllm
from opts.registry import OPTIMIZATIONS

pytestmark = pytest.mark.e2e

OVERRIDES = ["backend=vllm", "model=k3_tiny", "workload=agentx_small", "opts/kda_overlap=on", "opts/fusion=on",
             "opts/aiter_mla=on", "opts/cache_retention=evict", "opts/moe_dedup=on", "opts/draft_length=off",
             "backend.num_requests=4", "workload.start=zero"]


def test_the_app_runs_a_cell_with_every_toggle_set(pool, tmp_path):
    pool.close()
    proc = procs.run([sys.executable, "-m", "ablations", *OVERRIDES, f"hydra.run.dir={tmp_path}"], timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    modes = {name: toggle["mode"] for name, toggle in result["toggles"].items()}
    assert modes == {"aiter_mla": "on", "kda_overlap": "on", "fusion": "on", "cache_retention": "evict",
                     "moe_dedup": "on", "draft_length": "off"}
    cell = result["cell"]
    assert cell["toggles"] == result["toggles"] and result["model"] == "k3_tiny" and result["backend"] == "vllm"
    assert result["status"] == "ok" and result["metrics"] == cell["metrics"]
    metrics = result["metrics"]
    assert metrics["total_throughput"] > 0 and 0 < metrics["ttft_p50_s"] <= metrics["ttft_p90_s"]
    assert metrics["interactivity_p90"] > 0 and 0 < metrics["prefix_hit_rate"] < 1, metrics
    # The replay: the first 4 requests (two sessions' first two turns), each its trace output length capped at 16;
    # a second turn is sent after its first turn's answer, and hits the cache for that prefix.
    assert cell["num_requests"] == 4 and [len(t) for t in cell["output_token_ids"]] == [14, 16, 15, 16]
    requests = cell["requests"]
    assert requests[2]["arrival_s"] >= requests[0]["finish_s"] and requests[2]["cached_tokens"] > 0
    assert all(r["arrival_s"] <= r["first_token_s"] <= r["finish_s"] for r in requests)
    # The scheduler recorded its steps (steps.py): its prefill chunks add up to every prompt's uncached tokens.
    steps = cell["steps"]
    assert steps and all(0 <= s["start"] <= s["end"] for s in steps)
    prefilled = sum(n for s in steps for n, before, prompt, _ in s["requests"] if before < prompt)
    assert prefilled == sum(r["input_tokens"] - r["cached_tokens"] for r in requests)
    settings = EngineConfig(toggles=result["toggles"]).settings()
    assert settings["aiter_mla"].is_stock and settings["moe_dedup"].is_stock, "both on are stock vLLM-CPU"
    spec = settings["draft_length"].engine_args["speculative_config"]
    assert spec["num_speculative_tokens"] == 3 and not settings["draft_length"].patches
    counted = {name: {p.counter for p in s.patches if p.counter} for name, s in settings.items() if s.patches}
    assert counted == {"kda_overlap": {kda_overlap_vllm.PACKED_COUNTER},
                       "fusion": {fusion_vllm.MLA_COUNTER, fusion_vllm.KDA_COUNTER},
                       "cache_retention": {cache_vllm.COUNTER}}
    counts = cell["kernel_counts"]
    assert counts.get(MIXED_STEP_COUNTER, 0) > 0, "MTP (draft_length) mixes prefill and verify"
    # Every route of every toggle fires, except fusion's KDA decode route: a speculating engine runs no plain
    # decode step, so this cell does not exercise it (the fusion e2e tests do, without speculation).
    exercised = set().union(*counted.values()) - {fusion_vllm.KDA_COUNTER}
    assert {c: counts.get(c, 0) > 0 for c in exercised} == dict.fromkeys(exercised, True), counts
    assert counts.get(fusion_vllm.KDA_COUNTER, 0) == 0, "a plain decode step ran in a speculating engine"
    report = result["fired"]
    assert {name: entry["fired"] for name, entry in report.items()} == {
        "aiter_mla": None, "kda_overlap": True, "fusion": True, "cache_retention": True, "moe_dedup": None,
        "draft_length": None}
    assert "idle" in report["fusion"]["routes"][fusion_vllm.KDA_COUNTER]
    serving = [r for r in cell["processes"] if r["toggles"] is not None]
    assert "EngineCore" in {r["process"] for r in serving}, "the scheduler's process installs the vector"
    assert 1 <= len(serving) <= 2 and len(cell["processes"]) > len(serving), "engine core (scheduler) and worker"
    wanted = [p.target for name in OPTIMIZATIONS for p in settings[name].patches]
    for record in serving:
        assert [p["target"] for p in record["patches"]][-len(wanted):] == wanted, record["process"]
    wanted_pairs = {(p.target, p.why) for name in OPTIMIZATIONS for p in settings[name].patches}
    for record in cell["processes"]:
        if record not in serving:
            assert not {(p["target"], p["why"]) for p in record["patches"]} & wanted_pairs


def test_a_one_at_a_time_multirun_of_two_toggles_is_attributed(pool, tmp_path):
    """Four cells (all off, each alone, both), each a fresh engine replaying four requests; the attribution's
    Shapley values split all on - all off exactly (two toggles: one at a time is the full factorial)."""
    pool.close()
    args = ["-m", "design=one_at_a_time", "backend=vllm", "model=k3_tiny", "workload=agentx_small",
            "workload.start=zero", "backend.num_requests=4", "ablation.toggles=[kda_overlap,cache_retention]",
            "+ablation.on.cache_retention=evict", f"hydra.sweep.dir={tmp_path}"]
    proc = procs.run([sys.executable, "-m", "ablations", *args], timeout_s=800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cells = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert sorted(cells) == ["all_off.r0", "cache_retention.r0", "kda_overlap+cache_retention.r0", "kda_overlap.r0"]
    for name, result in cells.items():
        assert result["status"] == "ok", (name, result.get("error"))
        on = set(result["ablation"]["on"])
        assert {t: result["toggles"][t]["mode"] for t in ("kda_overlap", "cache_retention")} == {
            "kda_overlap": "on" if "kda_overlap" in on else "off",
            "cache_retention": "evict" if "cache_retention" in on else "off"}
        assert all(result["fired"][t]["fired"] is True for t in on), result["fired"]
    out = json.loads((tmp_path / "attribution.json").read_text())
    assert {"metric", "all_on", "all_off", "shapley", "interactions", "leave_one_out", "add_one_in"} <= set(out)
    assert out["metric"] == "total_throughput" and out["shapley_method"] == "exact" and out["missing"] == []
    assert sum(out["shapley"].values()) == pytest.approx(out["all_on"] - out["all_off"])
    assert (tmp_path / "attribution_bars.png").is_file()
    shown = text_of(execute("sweep.ipynb", {"K3_SWEEP_DIR": str(tmp_path)}))    # the notebooks on a real sweep
    assert "4 cells under" in shown and "missing: none" in shown and (tmp_path / "frontiers.png").is_file()
    shown = text_of(execute("attribution.ipynb", {"K3_SWEEP_DIR": str(tmp_path)}))
    assert "4 cells x 1 repeat(s) of one_at_a_time over kda_overlap, cache_retention: all present" in shown
