"""A serving cell end to end (`backend.mode=serve`, client vllm_bench): a fresh OpenAI server for the toggle
vector, the workload replayed at two concurrencies, vLLM's own counters per point, the SLO headline."""

from __future__ import annotations

import json
import sys

import procs
import pytest

pytestmark = pytest.mark.e2e


def test_a_serving_cell_replays_each_concurrency_from_an_empty_cache_and_reports_its_points(tmp_path):
    args = ["backend=vllm", "backend.mode=serve", "model=k3_tiny", "workload=agentx_small", "workload.start=zero",
            "backend.num_requests=4", "backend.concurrencies=[1,2]", "backend.target_interactivity=1000",
            f"hydra.run.dir={tmp_path}"]
    proc = procs.run([sys.executable, "-m", "ablations", *args], timeout_s=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    cell = result["cell"]
    assert result["status"] == "ok" and cell["mode"] == "serve" and cell["client"] == "vllm_bench"
    assert [p["concurrency"] for p in result["points"]] == [1, 2]
    details = cell["point_details"]
    for point in details:
        assert len(point["requests"]) == 4 and point["client_summary"]["completed"] == 4
        counters = point["vllm_counters"]
        # every prompt token was looked up in vLLM's prefix cache once per point
        assert counters["prefix_cache_queries"] == sum(r["input_tokens"] for r in point["requests"]) > 0
    # the cache is emptied before each point: the second point hits exactly what the first did, no more
    assert details[0]["vllm_counters"]["prefix_cache_hits"] == details[1]["vllm_counters"]["prefix_cache_hits"]
    hits = details[1]["vllm_counters"]
    rate = hits["prefix_cache_hits"] / hits["prefix_cache_queries"]
    assert result["metrics"]["prefix_hit_rate"] == pytest.approx(rate)
    # a target no point reaches: no headline number, the reason instead
    assert cell["slo"]["tput_per_gpu"] is None and "no point reaches 1000" in cell["slo"]["reason"]
    assert "tput_per_gpu_at_slo" not in result["metrics"]
    assert "Application startup complete" in (tmp_path / "server.log").read_text()
    assert all((tmp_path / f"client_c{c}.json").is_file() for c in (1, 2))
