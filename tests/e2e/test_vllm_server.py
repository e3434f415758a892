"""vLLM's OpenAI server on 127.0.0.1 serving the tiny K3 model, started and stopped by the project's code."""

from __future__ import annotations

import pytest
from vllm_pool import ENGINES, MAX_TOKENS, random_prompts

from ablations.backends.vllm.engine import EngineConfig
from ablations.backends.vllm.server import start_server

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(3, seed=5)


@pytest.fixture(scope="module")
def server(pool, tmp_path_factory):
    pool.generate("base", PROMPTS)  # the offline reference, computed before the server takes the CPU
    pool.close()
    base = ENGINES["base"]
    cfg = EngineConfig(model=base.model, enable_prefix_caching=True)
    log = tmp_path_factory.mktemp("server") / "vllm_server.log"
    srv = start_server(cfg, log)
    yield srv
    assert srv.stop() is not None
    assert not srv.is_running()
    assert "Application startup complete" in log.read_text() or log.stat().st_size > 0


def test_token_id_prompts_match_offline_engine(server, pool):
    expected = pool.generate("base", PROMPTS).tokens
    got = []
    for prompt in PROMPTS:
        body = server.request("/v1/completions", {
            "model": server.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True,
        })
        got.append(body["choices"][0]["token_ids"])
    assert got == expected


def test_text_completion_and_chat(server):
    body = server.request("/v1/completions", {
        "model": server.model, "prompt": "Kimi K3 on a CPU.", "max_tokens": 8, "temperature": 0.0, "ignore_eos": True,
        "logprobs": 1,
    })
    choice = body["choices"][0]
    assert body["usage"]["completion_tokens"] == 8 and isinstance(choice["text"], str)
    assert len(choice["logprobs"]["tokens"]) == 8
    chat = server.request("/v1/chat/completions", {
        "model": server.model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "temperature": 0.0, "ignore_eos": True,
    })
    assert chat["usage"]["completion_tokens"] == 4


def test_server_log_is_kept(server):
    assert server.log_path.exists()
    assert "--load-format k3_fan_in" in server.log_path.read_text().splitlines()[0]
