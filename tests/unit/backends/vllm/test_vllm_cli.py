"""`python -m ablations.backends.vllm`: a bad option is one `error: ...` line and exit code 2, before any engine."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ablations.backends.vllm.__main__ import DEFAULT_LOG, main
from ablations.backends.vllm.launch import engine, server
from ablations.backends.vllm.launch.engine import EngineConfig, server_args

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    """Starting an engine or a server fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("an engine was started")

    for module, name in ((engine, "open_llm"), (engine, "time_engine"), (server, "start_server")):
        monkeypatch.setattr(module, name, refuse)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [
    (["generate", "--set", "bogus=1"], ["--set bogus=1", "unknown field(s) bogus", "valid fields:", "dtype"]),
    (["generate", "--set", "dtype=float16"], ["--set dtype=float16", "'float16'", "float32, bfloat16"]),
    (["generate", "--set", "hidden_size=x"], ["--set hidden_size=x", "'x'", "valid: int"]),
    (["generate", "--set", "dtype"], ["--set", "'dtype'", "FIELD=VALUE"]),
    (["generate", "--mtp", "-1"], ["--mtp", "'-1'", "0 (off) or a positive integer"]),
    (["serve", "--mtp", "x"], ["--mtp", "'x'", "0 (off) or a positive integer"]),
    (["generate", "--mtp", "2", "--set", "num_nextn_predict_layers=0"], ["--mtp 2", "num_nextn_predict_layers=1"]),
    (["generate", "--token-ids", "abc"], ["--token-ids", "'abc'", "comma-separated token ids"]),
    (["generate", "--token-ids", "5,6,1024"], ["--token-ids 5,6,1024", "[1024]", "0..1023", "vocab_size 1024"]),
    (["generate", "--set", "vocab_size=512", "--token-ids", "600"], ["--token-ids 600", "0..511"]),
    (["generate", "--token-ids", "5,6", "--max-tokens", "0"], ["--max-tokens", "'0'", "positive integer"]),
    (["generate", "--token-ids", "5,6", "--max-tokens", "30", "--max-model-len", "16"],
     ["--token-ids", "2 prompt tokens", "--max-model-len 16"]),
    (["generate", "--max-model-len", "5000"], ["--max-model-len 5000", "1..4096"]),
    (["serve", "--port", "70000"], ["--port", "'70000'", "1..65535"]),
    (["report", "--requests", "0"], ["--requests", "'0'", "positive integer"]),
    (["bogus"], ["invalid choice", "'bogus'", "generate"]),
])
def test_bad_option_is_one_error_line(capsys, tmp_path, argv, expected):
    code, err = run_cli(capsys, *argv, "--dir", str(tmp_path / "model"))
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for text in expected:
        assert text in err


def test_busy_port_is_an_error(capsys, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_cli(capsys, "serve", "--port", str(port), "--dir", str(tmp_path))
    assert code == 2 and err.startswith(f"error: --port {port}: ") and "free port" in err


def test_log_path_that_is_a_directory_is_an_error(capsys, tmp_path):
    code, err = run_cli(capsys, "serve", "--log", str(tmp_path), "--dir", str(tmp_path / "m"))
    assert code == 2 and err.startswith(f"error: --log {tmp_path}: ") and "a file path" in err


def test_model_command_writes_the_directory(capsys, tmp_path):
    assert main(["model", "--dir", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "config.json").is_file()
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")


def test_default_server_log_is_git_ignored():
    ignored = [line.strip().rstrip("/") for line in (REPO / ".gitignore").read_text().splitlines()]
    assert DEFAULT_LOG.parts[0] in ignored


def test_server_is_asked_for_the_model_by_its_config_name(tmp_path):
    args = server_args(EngineConfig(model_dir=str(tmp_path)))
    assert args[args.index("--served-model-name") + 1] == "k3_tiny"
    assert EngineConfig(served_model_name="other").served_name == "other"
