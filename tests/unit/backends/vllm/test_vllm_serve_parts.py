"""The parts of a serving cell that need no server: the client's arguments (parsed by vLLM's own parser), its
per-request results read back, vLLM's counters read from Prometheus text, the trace cut to the model's context,
and the backend's serve settings checked."""

from __future__ import annotations

import json

import pytest

from ablations.backends.vllm.cells.prometheus import difference, read_counters
from ablations.backends.vllm.cells.serve_cell import capped_trace
from ablations.backends.vllm.clients.bench_client import client_args, read_records
from ablations.backends.vllm.config import VllmBackendConfig
from ablations.backends.vllm.launch.runtime import hide_media_wheels
from ablations.workload.trace import Request, Trace

METRICS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="k3_tiny"} 4096.0
vllm:prefix_cache_queries_created{engine="0",model_name="k3_tiny"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="k3_tiny"} 2688.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="k3_tiny"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="k3_tiny",position="1"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="k3_tiny",position="0"} 20.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="k3_tiny"} 0.0
"""


def test_every_client_argument_parses_with_vllms_own_parser(tmp_path):
    hide_media_wheels()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(client_args("http://127.0.0.1:1234", "k3_tiny", "/m", tmp_path / "t.jsonl", 16, 8, 4,
                                         tmp_path, "c4.json"))
    assert (args.dataset_name, args.max_concurrency, args.num_prompts, args.self_timed) == ("timed_trace", 4, 8, False)
    assert (args.timed_trace_chunk_hash_size, args.request_rate, args.save_detailed) == (16, float("inf"), True)
    assert (args.base_url, args.result_filename, args.temperature) == ("http://127.0.0.1:1234", "c4.json", 0.0)


def test_per_request_results_become_records_from_the_first_start(tmp_path):
    path = tmp_path / "c2.json"
    path.write_text(json.dumps({"completed": 2, "failed": 0, "duration": 1.0, "start_times": [100.5, 100.0],
                                "ttfts": [0.2, 0.1], "latencies": [0.9, 0.5], "input_lens": [512, 300],
                                "output_lens": [16, 8], "errors": ["", ""]}))
    records, summary = read_records(path)
    assert [(r.arrival_s, r.first_token_s, r.finish_s) for r in records] == [(0.5, 0.7, 1.4), (0.0, 0.1, 0.5)]
    assert [(r.input_tokens, r.output_tokens) for r in records] == [(512, 16), (300, 8)] and summary["completed"] == 2
    path.write_text(json.dumps({"failed": 1, "start_times": [1.0], "ttfts": [0], "latencies": [0], "input_lens": [0],
                                "output_lens": [0], "errors": ["Internal Server Error"]}))
    with pytest.raises(RuntimeError, match=r"c2.json: 1 request\(s\) failed \(request 0: Internal Server Error\)"):
        read_records(path)


def test_vllms_counters_are_read_and_differenced():
    after = read_counters(METRICS)
    assert (after["prefix_cache_queries"], after["prefix_cache_hits"], after["spec_decode_num_drafts"]) == (
        4096.0, 2688.0, 30.0)
    assert after["accepted_per_pos"] == [20.0, 9.0] and after["num_preemptions"] == 0.0
    before = read_counters(METRICS.replace("4096.0", "96.0").replace("} 20.0", "} 5.0"))
    delta = difference(after, before)
    assert (delta["prefix_cache_queries"], delta["prefix_cache_hits"], delta["accepted_per_pos"]) == (
        4000.0, 0.0, [15.0, 0.0])


def test_the_served_trace_is_cut_to_the_models_context():
    trace = Trace((Request(0, 1000, 50, tuple(range(63))), Request(5, 20, 3, (100, 101))), 16, "t")
    cut = capped_trace(trace, 512, 16)
    assert [(r.input_length, r.output_length, len(r.hash_ids)) for r in cut.requests] == [(512, 16, 32), (20, 3, 2)]


@pytest.mark.parametrize(("values", "field"), [
    ({"mode": "batch"}, "mode"), ({"client": "curl"}, "client"), ({"concurrencies": []}, "concurrencies"),
    ({"concurrencies": [0]}, "concurrencies"), ({"target_interactivity": 0.0}, "target_interactivity"),
    ({"replay_timeout_s": 0}, "replay_timeout_s"), ({"warmup_requests": -1}, "warmup_requests"),
])
def test_bad_serve_settings_are_named(values, field):
    with pytest.raises(ValueError, match=f"VllmBackendConfig.{field}: invalid value"):
        VllmBackendConfig(**values)
