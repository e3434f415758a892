"""A serving cell end to end (`backend.mode=serve`, client vllm_bench): a fresh OpenAI server for the toggle
vector, the workload replayed at two concurrencies, vLLM's own counters per point, the SLO headline."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import procs
import psutil
import pytest

pytestmark = pytest.mark.e2e


def _kill_the_second_cells_server(sweep_dir: Path, stop: threading.Event, killed: list[int]) -> None:
    """Once a second cell's client has started its second point, SIGKILL the server it talks to (by its --port)."""
    while not stop.is_set():
        done = {p.parent for p in sweep_dir.glob("*/result.json")}
        started = [p for p in sweep_dir.glob("*/client_c2.log") if p.parent not in done and
                   p.read_text().startswith("$ ")]
        if done and started:
            port = re.search(r"--base-url http://127.0.0.1:(\d+)", started[0].read_text()).group(1)
            for proc in psutil.process_iter(["pid", "cmdline"]):
                cmd = proc.info["cmdline"] or []
                if "vllm.entrypoints.openai.api_server" in " ".join(cmd) and port in cmd:
                    proc.kill()
                    killed.append(proc.info["pid"])
                    return
        time.sleep(0.2)


def test_serving_cells_replay_each_concurrency_from_an_empty_cache_and_a_killed_server_fails_only_its_cell(
        tmp_path):
    """Two cells (all off, kda_overlap on), each a fresh server replaying 4 requests at concurrencies 1 and 2; the
    second cell's server is SIGKILLed as its second point starts: that cell fails with the server log's tail, the
    sweep goes on, the finished cell reports both points, and the second cell's first point (kept in its
    directory) hit no more than the first cell's did: nothing of the first cell's traffic was cached for it."""
    args = ["-m", "design=one_at_a_time", "backend=vllm", "backend.mode=serve", "backend.client=vllm_bench",
            "model=k3_tiny", "workload=agentx_small", "workload.start=zero", "backend.num_requests=4",
            "backend.concurrencies=[1,2]",
            "backend.target_interactivity=1000", "ablation.toggles=[kda_overlap]", f"hydra.sweep.dir={tmp_path}"]
    stop, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_the_second_cells_server, args=(tmp_path, stop, killed), daemon=True)
    watcher.start()
    try:
        proc = procs.run([sys.executable, "-m", "ablations", *args], timeout_s=800)
    finally:
        stop.set()
        watcher.join(5)
    assert killed, "the second cell's server was never found"
    assert proc.returncode == 0, proc.stderr[-4000:]    # the sweep goes on past a failed cell
    results = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert sorted(results) == ["all_off.r0", "kda_overlap.r0"]
    failed = [r for r in results.values() if r["status"] == "failed"]
    finished = [r for r in results.values() if r["status"] == "ok"]
    assert len(failed) == 1 and len(finished) == 1, {k: r["status"] for k, r in results.items()}
    error = failed[0]["error"]
    assert "vLLM server died during the replay at concurrency 2" in error or "the server died" in error, error
    assert "server.log" in error and "(APIServer pid=" in failed[0]["error_detail"], "the server log's tail is kept"
    check_served_cell(finished[0], tmp_path / label(finished[0]))
    first = json.loads((tmp_path / label(failed[0]) / "point_c1.json").read_text())["vllm_counters"]
    mine = finished[0]["cell"]["point_details"][0]["vllm_counters"]
    assert (first["prefix_cache_queries"], first["prefix_cache_hits"]) == (mine["prefix_cache_queries"],
                                                                          mine["prefix_cache_hits"])


def label(result: dict) -> str:
    return f"{result['ablation']['cell']}.r0"


def check_served_cell(result: dict, cell_dir: Path) -> None:
    """What a finished serving cell reports: its points, vLLM's counters per point, the SLO reason."""
    cell = result["cell"]
    assert cell["mode"] == "serve" and cell["client"] == "vllm_bench"
    # the engine core's steps, every point's and not the warm-up request's: prefill chunks of every prompt token
    # the prefix cache did not hold, answers' decodes
    assert cell["warmup"]["requests"] == 1 and cell["warmup"]["steps"] > 0 and cell["warmup"]["seconds"] > 0
    prefilled = sum(r[0] for step in cell["steps"] for r in step["requests"] if r[1] < r[2])
    assert prefilled == sum(sum(r["input_tokens"] for r in p["requests"]) - p["vllm_counters"]["prefix_cache_hits"]
                            for p in cell["point_details"])
    assert any(r[1] >= r[2] for step in cell["steps"] for r in step["requests"])
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
    assert result["metrics"]["prefix_hit_rate"] == pytest.approx(rate) and result["metrics"]["num_requests"] == 4
    # a target no point reaches: no headline number, the reason instead
    assert cell["slo"]["tput_per_gpu"] is None and "no point reaches 1000" in cell["slo"]["reason"]
    assert "tput_per_gpu_at_slo" not in result["metrics"]
    assert "Application startup complete" in (cell_dir / "server.log").read_text()
    assert all((cell_dir / f"client_c{c}.json").is_file() for c in (1, 2))
