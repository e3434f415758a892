"""The aiperf client's parts that need neither aiperf nor a server: the Mooncake trace it replays (sessions, think
times, token-id prompts that share what the hash ids share, the session in vllm_xargs), the tokenizer laid out as an
offline Hugging Face cache entry, its arguments, and its per-request export read back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ablations.backends.vllm.clients.aiperf_client import (
    PARENT_KEY,
    SESSION_KEY,
    block_tokens,
    client_args,
    client_env,
    mooncake_rows,
    prompt_tokens,
    read_records,
    tokenizer_cache,
)
from ablations.backends.vllm.config import ModelConfig
from ablations.backends.vllm.launch.tiny_model import write_model_dir
from ablations.workload.trace import Request, Trace

VOCAB = 1024


def session_trace() -> Trace:
    """Session a: two turns (the second extends the first and thinks 250 ms); b: a sub-agent of a."""
    return Trace((Request(0, 40, 4, (1, 2, 3), "a", 0),
                  Request(10, 20, 3, (7, 8), "b", 0, 0.0, "a", 0),
                  Request(20, 60, 4, (1, 2, 3, 4), "a", 1, 250.0)), 16, "t")


def test_rows_carry_sessions_think_times_and_verbatim_payloads():
    rows = mooncake_rows(session_trace(), "k3_tiny", VOCAB)
    assert [r["session_id"] for r in rows] == ["a", "b", "a"]
    assert ["delay" in r for r in rows] == [False, False, True] and rows[2]["delay"] == 250.0
    payloads = [r["payload"] for r in rows]
    assert [len(p["prompt"]) for p in payloads] == [40, 20, 60]
    assert [(p["max_tokens"], p["min_tokens"], r["output_length"]) for p, r in zip(payloads, rows, strict=True)] == [
        (4, 4, 4), (3, 3, 3), (4, 4, 4)]
    assert payloads[0]["vllm_xargs"] == {SESSION_KEY: "a"}
    assert payloads[1]["vllm_xargs"] == {SESSION_KEY: "b", PARENT_KEY: "a"}
    assert all(p["model"] == "k3_tiny" and p["stream"] and p["ignore_eos"] and p["temperature"] == 0.0
               for p in payloads)


def test_a_trace_without_sessions_is_one_session_per_request():
    rows = mooncake_rows(Trace((Request(0, 5, 2, (9,)), Request(1, 5, 2, (9,))), 16, "t"), "m", VOCAB)
    assert [r["session_id"] for r in rows] == ["request-0", "request-1"]
    assert [r["payload"]["vllm_xargs"] for r in rows] == [{SESSION_KEY: "request-0"}, {SESSION_KEY: "request-1"}]


def test_shared_hash_ids_are_shared_tokens_and_others_differ():
    rows = mooncake_rows(session_trace(), "m", VOCAB)
    first, second = rows[0]["payload"]["prompt"], rows[2]["payload"]["prompt"]
    assert second[:40] == first, "turn 1 starts with turn 0's prompt (hash ids 1, 2 and the start of 3)"
    blocks = {tuple(block_tokens(h, 16, VOCAB)) for h in range(5000)}     # more ids than the 1014 token values
    assert len(blocks) == 5000, "different hash ids, different blocks"
    assert all(10 <= t < VOCAB for t in second)
    with pytest.raises(ValueError, match="50-token prompt: 2 hash ids of 16 tokens are too few"):
        prompt_tokens((1, 2), 50, 16, VOCAB)


def test_the_tokenizer_loads_offline_from_its_cache_entry(tmp_path):
    model_dir = write_model_dir(ModelConfig(), tmp_path / "model")
    cache = tmp_path / "hf"
    snapshot = tokenizer_cache(model_dir, cache, "k3-ablate/model", "local")
    assert (cache / "models--k3-ablate--model" / "refs" / "main").read_text() == "local"
    assert (snapshot / "tokenizer.json").is_file()
    code = ("from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained('k3-ablate/model'); "
            "print(len(t('abc')['input_ids']))")
    out = subprocess.run([sys.executable, "-c", code], env=client_env(cache), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "3"
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        tokenizer_cache(tmp_path, cache, "k3-ablate/none", "local")


def test_arguments_name_the_trace_the_concurrency_and_server_token_counts(tmp_path):
    args = client_args("http://127.0.0.1:9", "k3_tiny", "k3-ablate/m", tmp_path / "t.jsonl", 8, 4, tmp_path / "a")
    assert args[0] == "profile" and "--streaming" in args and "--use-server-token-count" in args

    def value(flag: str) -> str:
        return args[args.index(flag) + 1]

    assert (value("--custom-dataset-type"), value("--concurrency"), value("--num-sessions")) == (
        "mooncake_trace", "4", "8")
    assert "--request-count" not in args, "a request count stops mid-session or starts a session over"
    assert value("--input-file") == str(tmp_path / "t.jsonl") and value("--url") == "http://127.0.0.1:9"


def record(start_ns: int, end_ns: int, ttft_ms: float, isl: int, osl: int, error=None) -> dict:
    return {"metadata": {"session_num": 0, "request_start_ns": start_ns, "request_end_ns": end_ns},
            "metrics": {"time_to_first_token": {"value": ttft_ms, "unit": "ms"},
                        "input_sequence_length": {"value": isl, "unit": "tokens"},
                        "output_sequence_length": {"value": osl, "unit": "tokens"}},
            "error": error}


def test_the_per_request_export_becomes_records_from_the_first_start(tmp_path):
    rows = [record(3_000_000_000, 3_500_000_000, 100.0, 20, 3), record(1_000_000_000, 2_000_000_000, 250.0, 40, 4)]
    (tmp_path / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, summary = read_records(tmp_path)
    assert [(r.arrival_s, r.first_token_s, r.finish_s, r.input_tokens, r.output_tokens) for r in records] == [
        (0.0, 0.25, 1.0, 40, 4), (2.0, 2.1, 2.5, 20, 3)]
    assert (summary["completed"], summary["total_input_tokens"], summary["total_output_tokens"]) == (2, 60, 7)
    rows.append(record(4_000_000_000, 4_000_000_000, 0.0, 5, 1, error={"code": 500, "message": "boom"}))
    (tmp_path / "profile_export.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RuntimeError, match=r"1 request\(s\) failed .*boom"):
        read_records(tmp_path)
    with pytest.raises(RuntimeError, match="aiperf wrote no per-request records"):
        read_records(tmp_path / "missing")
