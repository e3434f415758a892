"""Serving cells with the aiperf client (`backend.client=aiperf`): aiperf from its own venv replays the workload's
sessions as a Mooncake trace (think times, session ids in `vllm_xargs`) against a fresh server per cell.

In `make test`: one full cell. Marked `heavy` (`make test-heavy`): both clients on one cell agree, and evict
raises the served hit rate over off under capacity pressure, seen in vLLM's own counters; the clients'
throughput ratio is a benchmark figure."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import procs
import pytest

from ablations.backends.vllm.cells.serve_cell import compare_clients
from ablations.config import compose_app
from ablations.workload import load_workload
from opts.registry import vector_dict

pytestmark = pytest.mark.e2e

REPEATS = 3     # replays per client and concurrency in the client comparison
CELL = ["backend=vllm", "backend.mode=serve", "model=k3_tiny", "workload.start=zero", "backend.target_interactivity=1"]


def run_cell(out_dir: Path, *overrides: str, timeout_s: float = 900) -> dict:
    """`python -m ablations` for one serving cell writing into `out_dir`; its result.json."""
    proc = procs.run([sys.executable, "-m", "ablations", *CELL, *overrides, f"hydra.run.dir={out_dir}"],
                     timeout_s=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out_dir / "result.json").read_text())
    assert result["status"] == "ok", result.get("error_detail") or result.get("error")
    return result


def totals(point: dict) -> tuple[int, int, int]:
    requests = point["requests"]
    return (len(requests), sum(r["input_tokens"] for r in requests), sum(r["output_tokens"] for r in requests))


def test_an_aiperf_cell_replays_the_sessions_and_vllm_counts_what_aiperf_sent(tmp_path):
    """Six agentx_small requests, two live sessions: every request answered, aiperf's token counts are vLLM's own
    (prompt and generated tokens from /metrics), each row carries its session, and the trace's prompts are the
    capped lengths the cell meant to send."""
    result = run_cell(tmp_path, "workload=agentx_small", "backend.client=aiperf", "backend.num_requests=6",
                      "backend.concurrencies=[2]")
    cell = result["cell"]
    assert cell["client"] == "aiperf" and [p["concurrency"] for p in result["points"]] == [2]
    point = cell["point_details"][0]
    count, prompt, output = totals(point)
    rows = [json.loads(line) for line in (tmp_path / "aiperf_trace.jsonl").read_text().splitlines()]
    assert count == len(rows) == 6
    assert prompt == sum(len(r["payload"]["prompt"]) for r in rows)
    assert output == sum(r["output_length"] for r in rows)
    counters = point["vllm_counters"]
    assert (counters["prompt_tokens"], counters["generation_tokens"], counters["requests_finished"]) == (
        prompt, output, 6)
    assert all(r["payload"]["vllm_xargs"]["k3_session"] == r["session_id"] for r in rows)
    assert max(len(r["payload"]["prompt"]) for r in rows) == 512, "prompts cut to backend.max_prompt_tokens"
    assert len({r["session_id"] for r in rows}) < 6, "the cut holds later turns of a session"
    assert (tmp_path / "aiperf_c2" / "profile_export.jsonl").is_file()
    assert result["metrics"]["num_requests"] == 6 and result["metrics"]["total_throughput"] > 0


@pytest.mark.heavy
def test_both_clients_record_the_same_requests_and_report_their_throughput_ratio(tmp_path, benchmark):
    """One cell (all off), 16 requests of a trace without sessions: one server, each client replaying them
    REPEATS times at concurrencies 1 and 2, the clients taking turns (`serve_cell.compare_clients`). Every
    replay's request count and token totals are equal. The clients' throughput ratio (aiperf's median over
    vllm_bench's) and each client's spread over its replays are benchmark figures (`extra_info`), not an assert:
    one replay against the next on the same server spreads by up to 25% on 2 cores."""
    app = compose_app([*CELL, "workload=mooncake_synthetic", "backend.num_requests=16", "backend.concurrencies=[1,2]"])
    benchmark.group = "serving clients"
    runs = benchmark.pedantic(lambda: compare_clients(app.backend, app.model, vector_dict(app.toggles()),
                                                      load_workload(app.workload), tmp_path, repeats=REPEATS,
                                                      model_cache=app.paths.model_cache), rounds=1, iterations=1)
    bench, aiperf = runs["vllm_bench"], runs["aiperf"]
    for concurrency in (1, 2):
        points = bench[concurrency] + aiperf[concurrency]
        assert len(points) == 2 * REPEATS and len({totals(p) for p in points}) == 1, [totals(p) for p in points]
        a, b = ([p["metrics"]["total_throughput"] for p in runs[concurrency]] for runs in (bench, aiperf))
        ratio = statistics.median(b) / statistics.median(a)
        spread = {name: (max(x) - min(x)) / statistics.median(x) for name, x in (("vllm_bench", a), ("aiperf", b))}
        benchmark.extra_info[f"c{concurrency}"] = {"ratio_aiperf_over_vllm_bench": ratio, "spread": spread,
                                                   "vllm_bench_tokens_s": a, "aiperf_tokens_s": b}
        print(f"concurrency {concurrency}: vllm_bench {[round(x, 1) for x in a]}, aiperf {[round(x, 1) for x in b]} "
              f"tokens/s; medians' ratio {ratio:.3f}; spread {spread}")


@pytest.mark.heavy
def test_evict_raises_the_served_hit_rate_over_off_under_capacity(tmp_path):
    """agentx_small's first 40 requests through aiperf (sessions in vllm_xargs, three live at once, prompts cut to
    2000 tokens) into a pool of 88 blocks: vLLM's own prefix-cache counters show more hits with evict than with
    stock vLLM; the replay (over 30 s) reports its progress."""
    common = ["workload=agentx_small", "backend.client=aiperf", "backend.num_requests=40", "backend.concurrencies=[3]",
              "backend.num_gpu_blocks_override=88", "backend.max_model_len=2048", "backend.max_prompt_tokens=2000",
              "backend.max_tokens=32"]
    rates = {}
    for mode in ("off", "evict"):
        result = run_cell(tmp_path / mode, *common, f"opts/cache_retention={mode}")
        counters = result["cell"]["point_details"][0]["vllm_counters"]
        rates[mode] = counters["prefix_cache_hits"] / counters["prefix_cache_queries"]
        assert "of 40 requests answered after" in (tmp_path / mode / "__main__.log").read_text()
    print(f"served hit rate: off {rates['off']:.4f}, evict {rates['evict']:.4f}")
    assert rates["evict"] > rates["off"]
