"""A serving cell (`backend.mode=serve`): a fresh vLLM OpenAI server for the cell's toggle vector, the workload
replayed against it by a client at each concurrency of a sweep, and the SLO headline read from the points.

The server runs on 127.0.0.1 at an ephemeral port with the cell's engine arguments, environment and
`additional_config` (the same `EngineConfig` as the in-process cell), its log in the cell's directory; it is
stopped when the cell ends, also on failure, so no cell inherits another's prefix cache. A server that dies
mid-replay is an error with its log's tail. Per concurrency point: per-request records (`ablations.metrics`
computes every metric from them over the steady-state window) and vLLM's own counters from `/metrics`, before
and after.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ablations.backends.vllm.cells.cell import NUM_DEVICES, PROCESS_DIR, fired, first_requests
from ablations.backends.vllm.cells.prometheus import difference, read_counters
from ablations.backends.vllm.clients.aiperf_client import AiperfClient, prompt_tokens
from ablations.backends.vllm.clients.bench_client import VllmBenchClient
from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.backends.vllm.in_vllm.counters import COUNTER_DIR_ENV, read_counts
from ablations.backends.vllm.in_vllm.steps import read_steps
from ablations.backends.vllm.in_vllm.toggles import read_records as read_patch_records
from ablations.backends.vllm.launch.engine import EngineConfig, engine_config, engine_kwargs, server_args
from ablations.backends.vllm.launch.server import SERVER_MODULE, Server, start_server
from ablations.cells import write_result
from ablations.metrics import SweepPoint, cell_metrics, steady_window, summarize, throughput_at_slo
from ablations.workload.trace import Trace, num_blocks

log = logging.getLogger("ablations")
SERVER_LOG, POINT_FILE = "server.log", "point_c{concurrency}.json"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"     # exposes POST RESET_PATH, which each point starts with
RESET_PATH = "/reset_prefix_cache"
COMPLETIONS_PATH = "/v1/completions"
CLIENT_NICENESS = 19


def capped_trace(trace: Trace, max_prompt_tokens: int, max_tokens: int) -> Trace:
    """`trace` with each prompt cut to `max_prompt_tokens` (its hash ids with it) and each answer to `max_tokens`:
    what the tiny model's context holds."""
    requests = []
    for r in trace.requests:
        length = min(r.input_length, max_prompt_tokens)
        requests.append(dataclasses.replace(r, input_length=length, output_length=min(r.output_length, max_tokens),
                                            hash_ids=r.hash_ids[:num_blocks(length, trace.block_size)]))
    return Trace(requests, trace.block_size, trace.source)


def _counters(server: Server) -> dict[str, Any]:
    try:
        return read_counters(server.metrics())
    except OSError as err:
        state = "running" if server.is_running() else f"dead (exit {server.process.returncode})"
        raise RuntimeError(f"vLLM server /metrics: {err}; the server is {state}; {server.log_excerpt()}") from None


def _reset_prefix_cache(server: Server, attempts: int = 20) -> None:
    """Empty the server's prefix cache, so that a point does not hit what the one before it left (vLLM refuses
    while blocks are held: retried)."""
    for _ in range(attempts):
        if server.request(RESET_PATH, {}).get("success", True):
            return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM server: {RESET_PATH} refused {attempts} times; log {server.log_path}")


def warmup_payloads(trace: Trace, num_requests: int, model: str, vocab_size: int) -> list[dict[str, Any]]:
    """`/v1/completions` bodies of `trace`'s first `num_requests` requests, prompts as token ids (what the clients
    send for them)."""
    return [{"model": model, "prompt": prompt_tokens(r.hash_ids, r.input_length, trace.block_size, vocab_size),
             "max_tokens": r.output_length, "ignore_eos": True, "temperature": 0.0}
            for r in trace.requests[:num_requests]]


def warm_up(server: Server, trace: Trace, num_requests: int, vocab_size: int) -> float:
    """Send `trace`'s first `num_requests` requests once, one at a time, answers discarded; the seconds it took.
    A fresh vLLM server's first request pays seconds of one-time start-up that no later one does; the points after
    it start from an empty prefix cache (`_point`)."""
    start = time.perf_counter()
    for payload in warmup_payloads(trace, num_requests, server.model, vocab_size):
        server.request(COMPLETIONS_PATH, payload)
    return time.perf_counter() - start


def make_client(name: str):
    """The client object of `backend.client` (its `setup` makes what it needs: aiperf's venv)."""
    return {"aiperf": AiperfClient, "vllm_bench": VllmBenchClient}[name]()


def _progress(server: Server, before: dict[str, Any], total: int, concurrency: int, start: float) -> None:
    try:
        done = difference(_counters(server), before)["requests_finished"]
    except RuntimeError:
        return
    log.info("vllm serve: concurrency %d: %d of %d requests answered after %.0f s", concurrency, done, total,
             time.perf_counter() - start)


def _point(server: Server, client, out_dir: Path, num_requests: int, concurrency: int, timeout_s: float,
           progress_s: float = 30.0) -> dict[str, Any]:
    """One concurrency point: the client's replay, its records and summary, vLLM's counters over it."""
    _reset_prefix_cache(server)
    argv, env, result = client.command(server.url, concurrency)
    before = _counters(server)
    client_log = out_dir / f"client_c{concurrency}.log"
    start = next_report = time.perf_counter()
    with client_log.open("w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        # the client at the lowest CPU priority: where it shares the server's cores, the server's steps go first
        proc = subprocess.Popen(["nice", "-n", str(CLIENT_NICENESS), *argv], stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        try:
            while proc.poll() is None:
                if not server.is_running():
                    raise RuntimeError(f"vLLM server died during the replay at concurrency {concurrency} (exit "
                                       f"{server.process.returncode}); {server.log_excerpt()}")
                now = time.perf_counter()
                if now - start > timeout_s:
                    raise RuntimeError(f"{client.name} client at concurrency {concurrency}: no result after "
                                       f"{timeout_s:.0f} s; log {client_log}")
                if now >= next_report + progress_s:
                    next_report = now
                    _progress(server, before, num_requests, concurrency, start)
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"exited {proc.returncode}")
        records, summary = client.read(result)
    except RuntimeError as err:
        tail = "\n".join(client_log.read_text(errors="replace").splitlines()[-20:])
        server_state = "" if server.is_running() else f"; the server died, {server.log_excerpt()}"
        raise RuntimeError(f"{client.name} client at concurrency {concurrency}: {err}; log {client_log}:\n{tail}"
                           f"{server_state}") from None
    counters = difference(_counters(server), before)
    window = steady_window(records)
    steady = summarize(records, NUM_DEVICES, window)
    log.info("vllm serve: concurrency %d: %d requests in %.1f s, %.1f tokens/s/GPU, P90 interactivity %.2f "
             "tokens/s/user, prefix hits %d of %d tokens", concurrency, len(records), time.perf_counter() - start,
             steady.throughput_per_gpu, steady.interactivity_p90, counters["prefix_cache_hits"],
             counters["prefix_cache_queries"])
    metrics = cell_metrics(records, NUM_DEVICES)
    # the client sees no per-request cached tokens: the hit rate is vLLM's own, over the point
    queries = counters["prefix_cache_queries"]
    metrics["prefix_hit_rate"] = counters["prefix_cache_hits"] / queries if queries else 0.0
    return {"concurrency": concurrency, "interactivity": steady.interactivity_p90,
            "throughput_per_gpu": steady.throughput_per_gpu, "steady_window_s": [window.start_s, window.end_s],
            "metrics": metrics, "client_summary": summary, "vllm_counters": counters,
            "requests": [dataclasses.asdict(r) for r in records]}


@contextmanager
def serving(cfg: EngineConfig, backend: VllmBackendConfig, out_dir: Path) -> Iterator[tuple[Server, float]]:
    """A fresh server for `cfg` (its log in `out_dir`, its processes' counts and patch records under
    PROCESS_DIR there) and the seconds it took to start; stopped on leaving, also on failure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("vllm serve: starting the server (%s) with toggles %s; log %s", backend.platform, cfg.toggles,
             out_dir / SERVER_LOG)
    t0 = time.perf_counter()
    server = start_server(cfg, out_dir / SERVER_LOG, timeout=backend.server_timeout_s,
                          env={**os.environ, COUNTER_DIR_ENV: str(out_dir / PROCESS_DIR), DEV_MODE_ENV: "1"})
    try:
        yield server, time.perf_counter() - t0
    finally:
        code = server.stop()
        log.info("vllm serve: server stopped (exit %s)", code)


def _served(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any], trace: Trace,
            model_cache: str) -> tuple[EngineConfig, Trace]:
    """The server's engine config (with its tokenizer: the clients send text) and the requests a cell sends."""
    cfg = dataclasses.replace(engine_config(backend, model, toggles, model_cache), skip_tokenizer_init=False)
    return cfg, capped_trace(first_requests(trace, backend.num_requests), backend.max_prompt_tokens,
                             backend.max_tokens)


def run_serve_cell(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any], trace: Trace,
                   out_dir: Path, model_cache: str = "") -> dict[str, Any]:
    """Start a server for `toggles`, replay the workload's first `backend.num_requests` requests at each of
    `backend.concurrencies`, stop it; the cell's result (the headline: throughput per GPU at
    `backend.target_interactivity`; left out of the metrics, with the reason in `slo`, when the points do not
    bracket it)."""
    cfg, cut = _served(backend, model, toggles, trace, model_cache)
    client = make_client(backend.client)
    client.setup()
    process_dir = out_dir / PROCESS_DIR
    points = []
    with serving(cfg, backend, out_dir) as (server, start_s):
        log.info("vllm serve: %s up in %.1f s at %s; %d requests per point, concurrencies %s, client %s",
                 model.name, start_s, server.url, len(cut.requests), list(backend.concurrencies), client.name)
        client.prepare(cut, out_dir, server.model, cfg.resolved_model_dir(), model.vocab_size)
        warmup_s = warm_up(server, cut, backend.warmup_requests, model.vocab_size)
        warmup_steps = len(read_steps(process_dir))
        log.info("vllm serve: %d warm-up request(s) in %.1f s (%d steps, left out)", backend.warmup_requests,
                 warmup_s, warmup_steps)
        for k, concurrency in enumerate(backend.concurrencies, 1):
            log.info("vllm serve: [point %d/%d] concurrency %d", k, len(backend.concurrencies), concurrency)
            points.append(_point(server, client, out_dir, len(cut.requests), concurrency, backend.replay_timeout_s))
            write_result(out_dir / POINT_FILE.format(concurrency=concurrency), points[-1])   # kept if a later one fails
    slo = throughput_at_slo([SweepPoint(p["interactivity"], p["throughput_per_gpu"], p["concurrency"])
                             for p in points], backend.target_interactivity)
    counts = read_counts(process_dir)
    metrics = dict(points[-1]["metrics"])
    if not slo.is_missing:    # absent, not NaN: attributing it over a cell without it names that cell
        metrics["tput_per_gpu_at_slo"] = slo.value
    return {
        "mode": "serve",
        "client": backend.client,
        "toggles": cfg.toggles,
        "platform": backend.platform,
        "engine_args": {k: v for k, v in engine_kwargs(cfg).items() if k != "model"},
        "server_command": [sys.executable, "-m", SERVER_MODULE, *server_args(cfg)],
        "env": {name: setting.env for name, setting in cfg.settings().items() if setting.env},
        "server_start_s": start_s,
        "warmup": {"requests": backend.warmup_requests, "seconds": warmup_s, "steps": warmup_steps},
        "num_requests": len(cut.requests),
        "metrics": metrics,
        "slo": {"target_interactivity": slo.target_interactivity,
                "tput_per_gpu": None if math.isnan(slo.value) else slo.value, "reason": slo.reason},
        "points": [{k: p[k] for k in ("concurrency", "interactivity", "throughput_per_gpu")} for p in points],
        "point_details": points,
        "kernel_counts": counts,
        "fired": fired(cfg, counts),
        "processes": read_patch_records(process_dir),
        "steps": read_steps(process_dir)[warmup_steps:],
    }


def compare_clients(backend: VllmBackendConfig, model: ModelConfig, toggles: dict[str, Any], trace: Trace,
                    out_dir: Path, clients: tuple[str, ...] = ("vllm_bench", "aiperf"), repeats: int = 2,
                    model_cache: str = "") -> dict[str, dict[int, list[dict[str, Any]]]]:
    """The clients compared on one engine: one server for `toggles`; at each of `backend.concurrencies`
    each client replays the cell's requests `repeats` times, the clients taking turns (a, b, a, b, ...), every
    replay from an empty prefix cache and in its own directory (`<client>.r<i>` under `out_dir`), so that the
    machine's drift falls on both alike; the server warmed up first as a cell's is (`warm_up`). Per client and
    concurrency, its replays' points (`_point`)."""
    if repeats < 1:
        raise ValueError(f"compare_clients: repeats must be at least 1, got {repeats}")
    cfg, cut = _served(backend, model, toggles, trace, model_cache)
    runs = [(name, r, make_client(name), out_dir / f"{name}.r{r}") for r in range(repeats) for name in clients]
    out: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in backend.concurrencies}
                                                       for name in clients}
    with serving(cfg, backend, out_dir) as (server, _):
        for _, _, client, run_dir in runs:
            client.setup()
            run_dir.mkdir(exist_ok=True)
            client.prepare(cut, run_dir, server.model, cfg.resolved_model_dir(), model.vocab_size)
        warm_up(server, cut, backend.warmup_requests, model.vocab_size)
        for concurrency in backend.concurrencies:
            for name, r, client, run_dir in runs:
                log.info("vllm serve: concurrency %d, %s replay %d of %d", concurrency, name, r + 1, repeats)
                out[name][concurrency].append(_point(server, client, run_dir, len(cut.requests), concurrency,
                                                     backend.replay_timeout_s))
    return out
