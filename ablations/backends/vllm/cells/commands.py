"""A serving cell's commands for a GPU node (`backend.print_commands=true`): the vLLM server and the two clients, from
the same settings a cell here runs with, for the `hardware` group's platform (rocm, cuda) and device count.

Nothing is started: the commands are printed and written to `commands.sh` in the run directory with the client
trace files beside it, for a person to run on the node. The server and `vllm bench serve` run through vLLM's own
command line (`python -m vllm.entrypoints.cli.main`) with the `python` of the environment k3-ablate is installed
in, so that vLLM loads its plugin (which applies the toggles' patches from `--additional-config`); aiperf from
`.venv-aiperf`. The server's environment carries each toggle's variables; `VLLM_SERVER_DEV_MODE=1` exposes
`/reset_prefix_cache`, which a cell calls before each concurrency point; the script first sends the warm-up
request(s) a cell sends (`backend.warmup_requests`, bodies in `warmup_<i>.json`).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path
from typing import Any

from ablations.backends.vllm.cells.cell import first_requests
from ablations.backends.vllm.cells.serve_cell import (
    COMPLETIONS_PATH,
    DEV_MODE_ENV,
    RESET_PATH,
    capped_trace,
    warmup_payloads,
)
from ablations.backends.vllm.clients.aiperf_client import TRACE_FILE as AIPERF_TRACE
from ablations.backends.vllm.clients.aiperf_client import (
    aiperf_bin,
    artifact_dir,
    mooncake_rows,
    num_sessions,
    write_rows,
)
from ablations.backends.vllm.clients.aiperf_client import client_args as aiperf_args
from ablations.backends.vllm.clients.bench_client import TRACE_FILE as BENCH_TRACE
from ablations.backends.vllm.clients.bench_client import client_args as bench_args
from ablations.backends.vllm.clients.bench_client import result_name
from ablations.backends.vllm.config import ModelConfig, VllmBackendConfig
from ablations.backends.vllm.launch.engine import EngineConfig, engine_config, server_args, toggle_env
from ablations.hardware import HardwareConfig
from ablations.workload.io import write_trace
from ablations.workload.trace import Trace

PORT = 8000
COMMANDS_FILE = "commands.sh"
WARMUP_FILE = "warmup_{index}.json"      # a warm-up request's body, as a serving cell sends it first
VLLM_CLI = ["python", "-m", "vllm.entrypoints.cli.main"]


def node_config(backend: VllmBackendConfig, model: ModelConfig, hardware: HardwareConfig,
                toggles: dict[str, Any]) -> EngineConfig:
    """The cell's EngineConfig on `hardware`: its platform's toggle settings (every toggle's off is wired on every
    platform; a mode a platform does not wire is a ValueError naming why), tensor parallel over its devices."""
    settings = dataclasses.replace(backend, platform=hardware.platform, tensor_parallel_size=hardware.num_devices)
    return dataclasses.replace(engine_config(settings, model, toggles), skip_tokenizer_init=False)


def server_command(cfg: EngineConfig) -> list[str]:
    """`vllm serve MODEL ...` with the cell's flags (the model positional, as `vllm serve` takes it), through
    VLLM_CLI."""
    args = server_args(cfg)
    i = args.index("--model")
    model = args[i + 1]
    return [*VLLM_CLI, "serve", model, *args[:i], *args[i + 2:], "--port", str(PORT)]


def server_env(cfg: EngineConfig) -> dict[str, str]:
    """The server's environment: each toggle's variables, and the dev endpoints the cell's resets use."""
    return {**toggle_env(cfg), DEV_MODE_ENV: "1"}


def gpu_commands(backend: VllmBackendConfig, model: ModelConfig, hardware: HardwareConfig, toggles: dict[str, Any],
                 trace: Trace, out_dir: Path) -> dict[str, Any]:
    """The server command and its environment, and per concurrency the reset and both clients' commands; the
    trace files they read (the workload's first `num_requests` requests, prompts and answers cut to the
    backend's `max_prompt_tokens` and `max_tokens`, as a cell here replays them) are written into `out_dir`."""
    cfg = node_config(backend, model, hardware, toggles)
    cut = capped_trace(first_requests(trace, backend.num_requests), backend.max_prompt_tokens, backend.max_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = mooncake_rows(cut, cfg.served_name, model.vocab_size)
    aiperf_trace = write_rows(rows, out_dir / AIPERF_TRACE)
    bench_trace = write_trace(cut, out_dir / BENCH_TRACE, form="timed_trace")
    url, tokenizer = f"http://127.0.0.1:{PORT}", str(cfg.resolved_model_dir())
    warmup = []
    for i, payload in enumerate(warmup_payloads(cut, backend.warmup_requests, cfg.served_name, model.vocab_size)):
        body = out_dir / WARMUP_FILE.format(index=i)
        body.write_text(json.dumps(payload))
        warmup.append(["curl", "-s", "-o", "/dev/null", "-X", "POST", url + COMPLETIONS_PATH, "-H",
                       "Content-Type: application/json", "-d", f"@{body}"])
    points = []
    for c in backend.concurrencies:
        points.append({
            "concurrency": c,
            "reset": ["curl", "-s", "-X", "POST", url + RESET_PATH],
            "aiperf": [str(aiperf_bin()), *aiperf_args(url, cfg.served_name, tokenizer, aiperf_trace,
                                                       num_sessions(rows), c, artifact_dir(out_dir, c))],
            "vllm_bench": [*VLLM_CLI, "bench", "serve",
                           *bench_args(url, cfg.served_name, tokenizer, bench_trace, cut.block_size,
                                       len(cut.requests), c, out_dir, result_name(c))],
        })
    return {"hardware": hardware.name, "platform": hardware.platform, "num_devices": hardware.num_devices,
            "toggles": cfg.toggles,
            "server_env": server_env(cfg), "server": server_command(cfg), "warmup": warmup, "points": points}


def script(commands: dict[str, Any], client: str) -> str:
    """The commands as a shell script: the server in the background, a wait for it to answer, the warm-up
    requests, then each point's reset and `client`."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(commands["server_env"].items()))
    lines = [f"# {commands['hardware']}: {commands['num_devices']} devices, platform {commands['platform']}",
             "# python: the interpreter of the environment k3-ablate is installed in (vLLM loads its plugin there)"]
    lines += [f"{env} {shlex.join(commands['server'])} &",
              f"until curl -sf http://127.0.0.1:{PORT}/health > /dev/null; do sleep 5; done"]
    lines += [shlex.join(command) for command in commands["warmup"]]
    for point in commands["points"]:
        lines += [shlex.join(point["reset"]), shlex.join(point[client])]
    return "\n".join(lines) + "\n"
