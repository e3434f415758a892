"""`python -m ablations backend=vllm ...`: the Hydra app starts the tiny engine with the toggle vector, generates
from the workload's first requests and records the vector, the kernel counts and every process's patches."""

from __future__ import annotations

import json
import sys

import procs
import pytest

from ablations.backends.vllm.cpu.kda import MIXED_STEP_COUNTER
from ablations.backends.vllm.engine import EngineConfig
from opts.cache_retention import vllm as cache_vllm
from opts.fusion import vllm as fusion_vllm
from opts.kda_overlap import vllm as kda_overlap_vllm
from opts.registry import OPTIMIZATIONS

pytestmark = pytest.mark.e2e

OVERRIDES = ["backend=vllm", "model=k3_tiny", "workload=agentx_small", "opts/kda_overlap=on", "opts/fusion=on",
             "opts/aiter_mla=on", "opts/cache_retention=evict", "opts/moe_dedup=on", "opts/draft_length=off",
             "backend.num_requests=4"]


def test_the_app_runs_a_cell_with_every_toggle_set(pool, tmp_path):
    pool.close()
    proc = procs.run([sys.executable, "-m", "ablations", *OVERRIDES, f"hydra.run.dir={tmp_path}"], timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    modes = {name: toggle["mode"] for name, toggle in result["toggles"].items()}
    assert modes == {"aiter_mla": "on", "kda_overlap": "on", "fusion": "on", "cache_retention": "evict",
                     "moe_dedup": "on", "draft_length": "off"}
    cell = result["backend"]
    assert cell["toggles"] == result["toggles"] and result["model"] == "k3_tiny"
    assert cell["num_requests"] == 4 and cell["output_tokens"] == 4 * 16
    assert all(len(tokens) == 16 for tokens in cell["output_token_ids"])
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
