"""vLLM's OpenAI server serving the tiny K3 model, started and stopped as a user does: `python -m
ablations.backends.vllm serve`, then Ctrl-C (SIGINT to that command)."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest
from vllm_pool import MAX_TOKENS, random_prompts

from ablations.backends.vllm.launch.server import Server, free_port

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(3, seed=5)
MODEL_NAME = "k3_tiny"


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for p in processes:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.fixture(scope="module")
def server(pool, tmp_path_factory):
    """The `serve` command on a free port (the same engine as the offline `base`, plus prefix caching)."""
    pool.generate("base", PROMPTS)  # the offline reference (the pool's engines stay up, idle, beside the server)
    tmp = tmp_path_factory.mktemp("server")
    log, out, port = tmp / "vllm_server.log", tmp / "serve.out", free_port()
    with out.open("w") as sink:
        cli = subprocess.Popen(
            [sys.executable, "-m", "ablations.backends.vllm", "serve", "--port", str(port), "--log", str(log)],
            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    srv = Server(cli, port, log, MODEL_NAME)
    try:
        srv.wait_ready(300)
        yield srv
    finally:
        stop_cli(cli)


def stop_cli(cli: subprocess.Popen) -> None:
    """Ctrl-C the serve command if it still runs; kill whatever it leaves."""
    if cli.poll() is None:
        left = descendants(cli.pid)
        cli.send_signal(signal.SIGINT)
        try:
            cli.wait(120)
        except subprocess.TimeoutExpired:
            cli.kill()
        for p in alive(left):
            p.kill()


def test_models_are_listed_by_the_config_name(server):
    assert [m["id"] for m in server.request("/v1/models")["data"]] == [MODEL_NAME]


def test_token_id_prompts_match_offline_engine(server, pool):
    expected = pool.generate("base", PROMPTS).tokens
    got = []
    for prompt in PROMPTS:
        body = server.request("/v1/completions", {
            "model": MODEL_NAME, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True,
        })
        got.append(body["choices"][0]["token_ids"])
    assert got == expected


def test_text_completion_and_chat(server):
    body = server.request("/v1/completions", {
        "model": MODEL_NAME, "prompt": "Kimi K3 on a CPU.", "max_tokens": 8, "temperature": 0.0, "ignore_eos": True,
        "logprobs": 1,
    })
    choice = body["choices"][0]
    assert body["usage"]["completion_tokens"] == 8 and isinstance(choice["text"], str)
    assert len(choice["logprobs"]["tokens"]) == 8
    chat = server.request("/v1/chat/completions", {
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "temperature": 0.0, "ignore_eos": True,
    })
    assert chat["usage"]["completion_tokens"] == 4


def test_ctrl_c_stops_everything_and_keeps_a_clean_log(server):
    started = descendants(server.process.pid)
    assert started, "the serve command has no server process"
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(120) == 0
    out = (server.log_path.parent / "serve.out").read_text()
    assert f"log kept at {server.log_path}" in out
    psutil.wait_procs(started, timeout=30)
    assert not alive(started), f"left running after Ctrl-C: {alive(started)}"
    text = server.log_path.read_text()
    assert "--load-format k3_fan_in" in text.splitlines()[0]
    assert "Application startup complete" in text
    assert "Traceback" not in text and "EngineDeadError" not in text, text[-3000:]
