"""Small builders shared by the workload tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from ablations.workload import Request
from ablations.workload.paths import TRACES, resolve_path

TRACES_DIR = resolve_path(TRACES)
CONVERSATION = TRACES_DIR / "conversation_trace.jsonl.gz"
SYNTHETIC = TRACES_DIR / "synthetic_trace.jsonl.gz"


def raw_rows(path: Path) -> list[dict]:
    """The JSON rows of a `.jsonl` or `.jsonl.gz` file, read without the workload reader."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def row(ts=0, n=10, out=5, block=4, ids=None, **extra) -> dict:
    """A valid timed_trace row: `n` input tokens covered by fresh-looking ids unless `ids` is given."""
    ids = list(range(100, 100 + math.ceil(n / block))) if ids is None else ids
    return {"timestamp": ts, "input_length": n, "output_length": out, "hash_ids": ids, **extra}


def request(session, turn, n, ids, ts=0.0, out=4, think_ms=0.0, parent=None) -> Request:
    return Request(timestamp_ms=ts, input_length=n, output_length=out, hash_ids=tuple(ids), session=session,
                   turn=turn, think_ms=think_ms, parent_session=None if parent is None else parent[0],
                   parent_turn=None if parent is None else parent[1])
