"""The `aiperf` client of a serving cell: NVIDIA's aiperf, the client InferenceX measures AgentX with, replaying the
workload's sessions as a Mooncake trace against a running server; its per-request export read back as
`ablations.metrics` records.

aiperf runs from its own virtual environment (`venv_dir()`: `.venv-aiperf` beside the project's `.venv`, or
`$K3_AIPERF_VENV`), pinned to AIPERF_VERSION and created on first use (`ensure_venv`; `make aiperf-env`), so the
project's venv does not depend on it. Its tokenizer is the tiny model's, laid out as a local Hugging Face cache
entry (`tokenizer_cache`) and read with `HF_HUB_OFFLINE=1`.

The trace (`mooncake_rows`): one row per request with its `session_id`, the think time before it (`delay`, ms,
after the session's previous answer: a closed loop) and a verbatim `/v1/completions` payload: the prompt as token
ids (a block of tokens per hash id, so requests that share hash ids share those tokens), `max_tokens` = `min_tokens`
= the output length, and the session in `vllm_xargs` (what cache_retention's session-aware modes read from
`SamplingParams.extra_args`). aiperf's `--concurrency` is the number of live sessions. A sub-agent session is
replayed as a session of its own (a Mooncake trace has no dependency between sessions): its first turn is not held
back until its parent's spawning turn has answered.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ablations.metrics import RequestRecord
from ablations.workload.trace import Trace

log = logging.getLogger("ablations")
AIPERF_VERSION = "0.13.0"
VENV_ENV = "K3_AIPERF_VENV"
ROOT = Path(__file__).resolve().parents[4]
RECORDS_FILE = "profile_export.jsonl"
TRACE_FILE = "aiperf_trace.jsonl"
SESSION_KEY, PARENT_KEY = "k3_session", "k3_parent"     # opts/cache_retention/in_vllm.py reads these
FIRST_TOKEN = 10                                        # ids below are left out of prompts (special tokens)
ID_DIGITS = 4                                           # a block's leading tokens that spell its hash id


def venv_dir() -> Path:
    """Where aiperf's virtual environment lives."""
    return Path(os.environ.get(VENV_ENV) or ROOT / ".venv-aiperf")


def aiperf_bin(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "aiperf"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)      # two test workers may ask at once: one builds, the other waits
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_venv(venv: Path | None = None, python: str | None = None, timeout_s: float = 1800.0) -> Path:
    """aiperf's venv with aiperf==AIPERF_VERSION, created on first use (a few minutes: about 1 GB of packages);
    its `aiperf` executable. A failed install is a RuntimeError with pip's last lines; the half-built venv goes."""
    venv = venv or venv_dir()
    stamp = venv / f".k3-aiperf-{AIPERF_VERSION}"
    if stamp.is_file() and aiperf_bin(venv).is_file():
        return aiperf_bin(venv)
    with _locked(venv.with_name(venv.name + ".lock")):
        if stamp.is_file() and aiperf_bin(venv).is_file():
            return aiperf_bin(venv)
        if venv.exists() and not any(venv.glob(".k3-aiperf-*")):
            raise RuntimeError(f"aiperf venv {venv}: the directory exists and was not made here (no .k3-aiperf-* "
                               f"stamp); remove it, or set {VENV_ENV} to another path")
        shutil.rmtree(venv, ignore_errors=True)
        install_log = venv.with_name(venv.name + "-install.log")
        log.info("aiperf: creating %s with aiperf==%s (first use; a few minutes); log %s", venv, AIPERF_VERSION,
                 install_log)
        start = time.perf_counter()
        venv.mkdir(parents=True)
        (venv / ".k3-aiperf-building").touch()     # ours, even half built: a later call may remove it
        with install_log.open("w") as out:
            for cmd in ([python or _base_python(), "-m", "venv", str(venv)],
                        [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                         "--progress-bar", "off", f"aiperf=={AIPERF_VERSION}"]):
                out.write("$ " + " ".join(cmd) + "\n")
                out.flush()
                try:
                    code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
                except subprocess.TimeoutExpired:
                    code = f"timeout after {timeout_s:.0f} s"
                if code != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    tail = "\n".join(install_log.read_text(errors="replace").splitlines()[-15:])
                    raise RuntimeError(f"aiperf venv {venv}: {cmd[2]} failed ({code}); log {install_log}:\n{tail}")
        for old in venv.glob(".k3-aiperf-*"):
            old.unlink()
        stamp.touch()
        log.info("aiperf: installed in %.0f s", time.perf_counter() - start)
    return aiperf_bin(venv)


def _base_python() -> str:
    """The interpreter the project's venv was made from (a venv made from a venv would see its packages)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def tokenizer_cache(model_dir: Path, cache_dir: Path, repo_id: str, revision: str) -> Path:
    """Lay the tokenizer files of `model_dir` out as the Hugging Face cache entry of `repo_id` at `revision`
    under `cache_dir` (models--ORG--NAME/snapshots/REV and refs/main), so that a client run with
    HF_HUB_CACHE=cache_dir and HF_HUB_OFFLINE=1 loads `repo_id` with no network; the snapshot's path."""
    entry = cache_dir / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in model_dir.iterdir() if p.name.startswith(("tokenizer", "special_tokens"))]
    if "tokenizer.json" not in names:
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json to lay out for {repo_id}")
    for name in names:
        shutil.copyfile(model_dir / name, snapshot / name)
    # transformers' AutoTokenizer reads config.json first; an empty one leaves the class to tokenizer_config.json
    # (the model's own names a model type the client's transformers may not know)
    (snapshot / "config.json").write_text("{}")
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(revision)
    return snapshot


def block_tokens(hash_id: int, block_size: int, vocab_size: int) -> list[int]:
    """The token ids a hash id stands for: the same block wherever it appears (shared hash ids, shared tokens),
    different blocks for different ids (the block opens with the id's ID_DIGITS digits in base
    vocab_size - FIRST_TOKEN)."""
    span = vocab_size - FIRST_TOKEN
    positions = min(ID_DIGITS, block_size)
    if not 0 <= hash_id < span ** positions:
        raise ValueError(f"hash id {hash_id}: valid ids are 0..{span ** positions - 1} in blocks of {block_size} "
                         f"tokens over a vocabulary of {vocab_size}")
    digits = [hash_id // span ** k % span for k in range(positions)]
    fill = [(hash_id * 7919 + j * 104729) % span for j in range(positions, block_size)]
    return [FIRST_TOKEN + v for v in digits + fill]


def prompt_tokens(hash_ids: tuple[int, ...], input_length: int, block_size: int, vocab_size: int) -> list[int]:
    """`input_length` token ids: the hash ids' blocks in order, the last one cut."""
    tokens: list[int] = []
    for h in hash_ids:
        if len(tokens) >= input_length:
            break
        tokens.extend(block_tokens(h, block_size, vocab_size))
    if len(tokens) < input_length:
        raise ValueError(f"{input_length}-token prompt: {len(hash_ids)} hash ids of {block_size} tokens are too few")
    return tokens[:input_length]


def mooncake_rows(trace: Trace, model: str, vocab_size: int) -> list[dict[str, Any]]:
    """The aiperf Mooncake trace of `trace` (rows in trace order; a session's turns in turn order): see the
    module docstring."""
    rows = []
    for i, r in enumerate(trace.requests):
        session = r.session if r.session is not None else f"request-{i}"
        xargs = {SESSION_KEY: session}
        if r.parent_session is not None:
            xargs[PARENT_KEY] = r.parent_session
        payload = {"model": model, "prompt": prompt_tokens(r.hash_ids, r.input_length, trace.block_size, vocab_size),
                   "max_tokens": r.output_length, "min_tokens": r.output_length, "ignore_eos": True,
                   "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
                   "vllm_xargs": xargs}
        row: dict[str, Any] = {"session_id": session, "output_length": r.output_length, "payload": payload}
        if r.turn:
            row["delay"] = r.think_ms
        rows.append(row)
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))
    return path


def client_env(cache_dir: Path) -> dict[str, str]:
    """aiperf's environment: offline, the tokenizer from `cache_dir`, no proxy for 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PYTEST"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(cache_dir), HF_HOME=str(cache_dir),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


def client_args(base_url: str, model: str, tokenizer: str, trace_path: Path, num_sessions: int, concurrency: int,
                artifact_dir: Path) -> list[str]:
    """The `aiperf profile` arguments of one concurrency point: each of the trace's `num_sessions` sessions once,
    every turn of it (a request count would stop mid-session, or start a session over), `concurrency` live
    sessions, streaming completions, token counts from the server's usage, per-request records exported."""
    return [
        "profile", "--model", model, "--url", base_url, "--endpoint-type", "completions", "--streaming",
        "--input-file", str(trace_path), "--custom-dataset-type", "mooncake_trace", "--concurrency", str(concurrency),
        "--num-sessions", str(num_sessions), "--tokenizer", tokenizer, "--use-server-token-count",
        "--artifact-dir", str(artifact_dir), "--random-seed", "0", "--ui-type", "none", "--export-level", "records",
        # the cell reads vLLM's counters itself: aiperf's scraping of /metrics would take the server's CPU
        "--no-server-metrics", "--no-gpu-telemetry",
    ]


def read_records(artifact_dir: Path) -> tuple[list[RequestRecord], dict[str, Any]]:
    """Per-request records of aiperf's `profile_export.jsonl` (times from the first request's start) and totals;
    a failed request is a RuntimeError naming it and its error."""
    path = artifact_dir / RECORDS_FILE
    if not path.is_file():
        raise RuntimeError(f"{path}: aiperf wrote no per-request records")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    failed = [r for r in rows if r.get("error")]
    if failed:
        raise RuntimeError(f"{path}: {len(failed)} request(s) failed (first: {json.dumps(failed[0]['error'])[:300]})")
    if not rows:
        raise RuntimeError(f"{path}: no request finished")
    t0 = min(r["metadata"]["request_start_ns"] for r in rows)
    records = []
    for r in sorted(rows, key=lambda r: r["metadata"]["request_start_ns"]):
        m, meta = r["metrics"], r["metadata"]
        start = (meta["request_start_ns"] - t0) / 1e9
        end = (meta["request_end_ns"] - t0) / 1e9
        ttft = _seconds(m["time_to_first_token"])
        records.append(RequestRecord(start, start + ttft, max(end, start + ttft),
                                     int(_value(m["input_sequence_length"])),
                                     max(1, int(_value(m["output_sequence_length"])))))
    summary = {"completed": len(records), "total_input_tokens": sum(r.input_tokens for r in records),
               "total_output_tokens": sum(r.output_tokens for r in records),
               "duration": max(r.finish_s for r in records)}
    return records, summary


def _value(metric: Any) -> float:
    return float(metric["value"] if isinstance(metric, dict) else metric)


def _seconds(metric: Any) -> float:
    unit = metric.get("unit", "ms") if isinstance(metric, dict) else "ms"
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0}.get(unit)
    if scale is None:
        raise RuntimeError(f"aiperf record: unknown time unit {unit!r}")
    return _value(metric) * scale


def artifact_dir(out_dir: Path, concurrency: int) -> Path:
    """Where aiperf writes a concurrency point's exports."""
    return out_dir / f"aiperf_c{concurrency}"


def num_sessions(rows: list[dict[str, Any]]) -> int:
    return len({row["session_id"] for row in rows})


class AiperfClient:
    """The serving cell's `aiperf` client: its venv made before the server starts (`setup`), the trace and
    tokenizer written once per cell, one `aiperf profile` per concurrency point."""

    name = "aiperf"

    def setup(self) -> None:
        self.executable = ensure_venv()

    def prepare(self, trace: Trace, out_dir: Path, model: str, model_dir: Path, vocab_size: int) -> None:
        rows = mooncake_rows(trace, model, vocab_size)
        self.out_dir, self.model, self.num_sessions = out_dir, model, num_sessions(rows)
        self.trace_path = write_rows(rows, out_dir / TRACE_FILE)
        self.cache_dir = out_dir / "hf_cache"
        self.repo_id = f"k3-ablate/{model_dir.name}"
        tokenizer_cache(model_dir, self.cache_dir, self.repo_id, "local")

    def command(self, base_url: str, concurrency: int) -> tuple[list[str], dict[str, str], Path]:
        """(argv, environment, what `read` takes) of one concurrency point."""
        artifacts = artifact_dir(self.out_dir, concurrency)
        shutil.rmtree(artifacts, ignore_errors=True)
        args = client_args(base_url, self.model, self.repo_id, self.trace_path, self.num_sessions, concurrency,
                           artifacts)
        return [str(self.executable), *args], client_env(self.cache_dir), artifacts

    def read(self, result: Path) -> tuple[list[RequestRecord], dict[str, Any]]:
        return read_records(result)


def main(argv: list[str] | None = None) -> int:
    """`python -m ablations.backends.vllm.clients.aiperf_client setup`: create aiperf's venv now."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["setup"]:
        print("usage: python -m ablations.backends.vllm.clients.aiperf_client setup", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(ensure_venv())
    return 0


if __name__ == "__main__":
    sys.exit(main())
